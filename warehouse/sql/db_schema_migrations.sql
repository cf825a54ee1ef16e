-- The table that records which numbered migrations (warehouse/migrations/) a database has had.
CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)
