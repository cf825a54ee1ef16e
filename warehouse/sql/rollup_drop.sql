-- Drops one of a roll's temp tables (compacted, rolled, rolled_minutes): `temp.` names the temp
-- catalog, so a stored table of that name could never be dropped (warehouse/rollup.py).
DROP TABLE temp.{{table}}
