-- remove a rack's rows of a lake table
DELETE FROM lake.{{table}} WHERE rack = $rack
