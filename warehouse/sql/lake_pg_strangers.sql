-- objects of the catalog (DuckLake's tables, schema moemeter and what is in it) the lake's owner does not own
SELECT n.nspname || '.' || c.relname, pg_get_userbyid(c.relowner)::text FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE (n.nspname = 'moemeter' OR (n.nspname = 'public' AND c.relname LIKE 'ducklake%'))
  AND c.relowner <> (SELECT relowner FROM pg_class WHERE oid = 'public.ducklake_metadata'::regclass)
UNION ALL
SELECT 'schema moemeter', pg_get_userbyid(nspowner)::text FROM pg_namespace
WHERE nspname = 'moemeter'
  AND nspowner <> (SELECT relowner FROM pg_class WHERE oid = 'public.ducklake_metadata'::regclass)
