-- Users: user ids containing $text (case-insensitive) in all the history kept.
SELECT user_id FROM requests_1h WHERE user_id ILIKE '%' || $text || '%' GROUP BY user_id
UNION SELECT user_id FROM requests WHERE user_id ILIKE '%' || $text || '%' GROUP BY user_id
ORDER BY user_id LIMIT $limit
