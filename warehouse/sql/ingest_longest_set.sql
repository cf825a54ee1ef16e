-- Stores the longest interval a raw increment covers, $seconds.
INSERT INTO longest_interval VALUES ($seconds)
