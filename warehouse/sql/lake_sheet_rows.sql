-- a rack's rows of a lake table, of the columns named (in the lake table's order)
SELECT COLUMNS($columns) FROM lake.{{table}} WHERE rack = $rack
