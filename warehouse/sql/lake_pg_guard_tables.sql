-- guard and grant each table of the catalog not guarded yet (moemeter.guard_tables), under the install's
-- advisory lock (GUARD_LOCK, a literal: PostgreSQL binds no parameter in a script sent whole)
SELECT pg_advisory_xact_lock({{'lock'}}::bigint);
SELECT moemeter.guard_tables()
