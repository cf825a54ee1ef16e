-- The tenants each of the users $names has requests stored in (the records and the hourly sums).
SELECT DISTINCT user_id, tenant
FROM (SELECT user_id, tenant FROM requests UNION ALL SELECT user_id, tenant FROM requests_1h)
WHERE list_contains($names, user_id) ORDER BY ALL
