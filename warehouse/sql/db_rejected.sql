-- Records what was refused or repaired: $count samples, records or snapshots of $target, for
-- $reason (warehouse/db.py, record_rejected).
INSERT INTO rejected (ts, target, kind, reason, count) VALUES ($ts, $target, $kind, $reason, $count)
