-- Users: the users (tenant and user id: a user is named within its tenant) whose id or tenant
-- contains $text (case-insensitive), in all the history kept.
SELECT tenant, user_id FROM requests_1h WHERE user_id ILIKE '%' || $text || '%' OR tenant ILIKE '%' || $text || '%'
GROUP BY ALL
UNION SELECT tenant, user_id FROM requests WHERE user_id ILIKE '%' || $text || '%' OR tenant ILIKE '%' || $text || '%'
GROUP BY ALL
ORDER BY user_id, tenant LIMIT $limit
