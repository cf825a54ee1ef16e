-- the rebalance events of a rack the lake holds in a window, keyed (target, ts, layer)
SELECT target, ts, layer FROM lake.{{events}} WHERE rack = $rack AND
/*lake_edges*/
