-- Stores a target's new EPLB rebalances (the Arrow batch `_insert_batch`, a row per event and
-- layer), an event stored already left as it is (warehouse/experts.py).
INSERT OR IGNORE INTO eplb_rebalances SELECT * FROM _insert_batch
