-- the lake's commit lock (COMMIT_LOCK), waited for at most LOCK_WAIT, held until the transaction ends; both are
-- literals: PostgreSQL binds no parameter in SET, nor in a script sent whole (postgres_execute)
SET LOCAL lock_timeout = {{'wait'}};
SELECT pg_advisory_xact_lock({{'lock'}}::bigint)
