-- a lake table of the warehouse's table of the same name: a rack column, then the warehouse's columns
CREATE TABLE lake.{{table}} AS SELECT NULL::VARCHAR AS rack, * FROM memory.main.{{table}} WITH NO DATA
