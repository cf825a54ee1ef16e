-- The compacted rows (temp table `compacted`) back into the counter rollup they came from
-- (warehouse/rollup.py, _compact).
INSERT INTO {{table}} BY NAME SELECT * FROM compacted
