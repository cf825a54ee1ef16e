-- Every roll-up's and retention's mark: how far it has rolled (or dropped).
SELECT name, through FROM rollup_state
