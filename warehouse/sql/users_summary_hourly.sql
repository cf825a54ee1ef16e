-- Users: the window's requests, users, errors and tokens from the hourly sums, and the mean TTFT.
WITH /*requests_hourly*/
SELECT sum(requests) n, count(DISTINCT (tenant, user_id)) users, sum(errors) errors, sum(prompt_tokens) p,
       sum(cached_prompt_tokens) c, sum(generated_tokens) g, sum(ttft_sum_seconds) / nullif(sum(requests), 0) ttft
FROM hourly
