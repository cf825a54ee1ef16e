-- Every stored target as the writer compares a round's with: a target stored as it is only has its
-- last_seen moved.
SELECT name, url, role, gpus, stack, hostname FROM targets
