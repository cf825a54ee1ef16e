-- remove a rack's rows of a lake table in a window
DELETE FROM lake.{{table}} WHERE rack = $rack AND
/*lake_edges*/
