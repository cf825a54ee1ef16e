-- the local warehouse's watermarks (name, through)
SELECT name, through FROM rollup_state
