-- A hash join whose build side holds at most $count distinct keys hands them to the scan on its
-- probe side, which then skips every row group whose zone map holds none of them (DuckDB's default
-- is 50 keys; past it, only the keys' min and max). A page's `picked` series are a few hundred ids in
-- a few runs of the series order, and the closed hours' rollup rows are stored series by series:
-- the Cost page's day of minute rows for 360 token series scanned 10.6 M rows instead of 19.1 M.
SET GLOBAL dynamic_or_filter_threshold = $count  -- GLOBAL: every cursor, the readers' too
