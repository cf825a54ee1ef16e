-- attach the lake's PostgreSQL catalog once more, plainly, for the commit lock (LOCK_DB); its connection string
-- a literal: DuckDB binds no parameter in ATTACH's path
ATTACH {{'catalog'}} AS {{lock_db}} (TYPE postgres)
