-- A roll's rows of a per-series counter rollup (temp table `rolled`) into {{table}} (increments_1m,
-- _6m or _1h; warehouse/rollup.py, _store_rolled).
INSERT INTO {{table}} BY NAME SELECT * FROM rolled
