-- Stores one expert-load snapshot's shape: target $target at $ts, $seconds since its previous one
-- (NULL for a first), and whether its counters went down ($reset: a restart).
INSERT INTO expert_snapshots (ts, target, seconds, layers, experts, slots, ranks, reset)
VALUES ($ts, $target, $seconds, $layers, $experts, $slots, $ranks, $reset)
