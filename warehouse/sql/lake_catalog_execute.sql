-- run a statement (or a script) on the lake's PostgreSQL catalog, attached plainly (LOCK_DB)
CALL postgres_execute($database, $statement)
