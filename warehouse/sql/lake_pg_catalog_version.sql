-- the version of DuckLake's catalog (the guard knows DUCKLAKE_CATALOG's tables)
SELECT value FROM public.ducklake_metadata WHERE key = 'version' ORDER BY scope NULLS FIRST
