-- The temp table `rolled`: the raw increments of [$from, $until) split into minutes, the line below
-- being warehouse/sql/roll_increments.sql (warehouse/rollup.py, _roll).
CREATE OR REPLACE TEMP TABLE rolled AS
/*roll_increments*/
