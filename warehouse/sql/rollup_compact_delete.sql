-- A counter rollup's rows in [$start, $until), once they are copied compacted into the temp table
-- `compacted` (warehouse/rollup.py, _compact).
DELETE FROM {{table}} WHERE ts >= $start AND ts < $until
