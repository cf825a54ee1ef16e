-- The time of the last EPLB rebalance stored for target $target (NULL: none): a snapshot repeats
-- the recent ones, only newer ones are stored.
SELECT max(ts) AS ts FROM eplb_rebalances WHERE target = $target
