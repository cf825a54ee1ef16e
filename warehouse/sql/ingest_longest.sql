-- The longest interval a raw increment covers (0: none stored): how far the read layer looks back
-- past a window's edge for a row that reaches into it.
SELECT coalesce(max(seconds), 0) AS seconds FROM longest_interval
