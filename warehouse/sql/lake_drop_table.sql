-- a reader's own (empty) table, replaced by a view of one rack's rows
DROP TABLE IF EXISTS main.{{table}}
