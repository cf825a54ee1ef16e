-- Turns off one of a database instance's dangerous settings for every connection readers use
-- ({{setting}}: one of warehouse/readonly.py's LOCKED_DOWN): no file or network access from SQL, no
-- Python variable read as a table.
SET {{setting}} = false
