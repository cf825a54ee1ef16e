-- Keeps a roll's minute rows (temp table `rolled`) as `rolled_minutes`, which the six-minute and
-- hour rows are summed from (warehouse/rollup.py, _roll).
ALTER TABLE rolled RENAME TO rolled_minutes
