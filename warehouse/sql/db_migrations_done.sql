-- The versions of the migrations a database has had.
SELECT version FROM schema_migrations
