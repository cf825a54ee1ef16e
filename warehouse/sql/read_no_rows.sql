-- (a statement's six-minute rows in a file without six-minute rollups, a lake's rack;
-- warehouse/read.py) no rows, with a rollup's columns
(SELECT NULL::TIMESTAMP AS ts, NULL AS series_id, NULL::DOUBLE AS delta, NULL::DOUBLE AS seconds,
        NULL::DOUBLE AS idle_seconds WHERE false)
