-- A roll's rows of a per-series counter rollup (temp table `rolled`), their histogram and summary
-- series summed per pool, into the pool rollup {{table}} (pool_histograms_1m, _6m or _1h); the line
-- below is warehouse/sql/roll_pool_histograms.sql (warehouse/rollup.py, _store_rolled).
INSERT INTO {{table}} BY NAME
/*roll_pool_histograms*/
