-- a table of this connection as one rack's rows of the lake's, of the warehouse's columns in its order: the columns
-- quoted as identifiers and the rack a literal (DuckDB binds no parameter in a view)
CREATE VIEW main.{{table}} AS SELECT {{"columns"}} FROM lake.{{table}} WHERE rack = {{'rack'}}
