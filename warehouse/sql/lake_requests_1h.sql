-- A rack's requests_1h rows of the hours [$finished_from, $finished_until) as its own file sums them
-- (requests_hourly.sql): the table's rows and the same sums of the records stored since the hourly
-- roll-up's watermark (a NULL $ingested_from) and before $ingested_until, one row per hour, user,
-- tenant and model. The lake holds no records: a request stored after its hour was rolled up (it
-- finished in the hour's last seconds) is published with the hour, not an hour later (lake.py).
SELECT ts, user_id, tenant, model, sum(requests)::BIGINT AS requests, sum(errors)::BIGINT AS errors,
       sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(cached_prompt_tokens)::BIGINT AS cached_prompt_tokens,
       sum(generated_tokens)::BIGINT AS generated_tokens, sum(timed)::BIGINT AS timed,
       sum(itl_sum_seconds) AS itl_sum_seconds, sum(ttft_sum_seconds) AS ttft_sum_seconds,
       sum(e2e_sum_seconds) AS e2e_sum_seconds
FROM (SELECT * FROM requests_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
      UNION ALL BY NAME
      /*requests_hour_sums*/)
GROUP BY ts, user_id, tenant, model
