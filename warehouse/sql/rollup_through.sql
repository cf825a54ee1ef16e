-- How far the roll-up named $name has rolled (NULL: not yet).
SELECT max(through) AS through FROM rollup_state WHERE name = $name
