-- Records that migration $version ($name) was applied, now.
INSERT INTO schema_migrations VALUES ($version, $name, now()::TIMESTAMP)
