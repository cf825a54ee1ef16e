-- Cost: per user (of a tenant: a user is named within its tenant), the requests that finished in
-- [$start, $end) and their tokens: the whole hours [$finished_from, $finished_until) from the hourly
-- sums (and the records not rolled up yet), the edges from the records.
WITH /*requests_hourly*/
SELECT tenant, user_id AS user, sum(requests)::BIGINT AS requests, sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_prompt_tokens)::BIGINT AS cached_prompt_tokens, sum(generated_tokens)::BIGINT AS generated_tokens
FROM (SELECT tenant, user_id, requests, prompt_tokens, cached_prompt_tokens, generated_tokens FROM hourly
      UNION ALL
      -- each edge its own scan: one condition of two ranges would read every record of the day
      SELECT tenant, user_id, 1, prompt_tokens, coalesce(cached_prompt_tokens, 0), generated_tokens FROM requests
      WHERE finished_at >= $start::TIMESTAMP AND finished_at < $finished_from::TIMESTAMP
      UNION ALL
      SELECT tenant, user_id, 1, prompt_tokens, coalesce(cached_prompt_tokens, 0), generated_tokens FROM requests
      WHERE finished_at >= $finished_until::TIMESTAMP AND finished_at < $end::TIMESTAMP)
GROUP BY tenant, user_id ORDER BY tenant, user_id
