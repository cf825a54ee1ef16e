-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing hour's per-class
-- and tenant SLO sums; the line below is warehouse/sql/requests_slo.sql (warehouse/requests.py,
-- roll_requests_1h).
INSERT INTO requests_slo_1h
/*requests_slo*/
ON CONFLICT (ts, class, tenant) DO UPDATE SET
    requests = requests + excluded.requests, held = held + excluded.held, met = met + excluded.met,
    failed = failed + excluded.failed, missed_ttft = missed_ttft + excluded.missed_ttft,
    missed_itl = missed_itl + excluded.missed_itl, missed_e2e = missed_e2e + excluded.missed_e2e,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
    generated_tokens = generated_tokens + excluded.generated_tokens,
    good_prompt_tokens = good_prompt_tokens + excluded.good_prompt_tokens,
    good_cached_prompt_tokens = good_cached_prompt_tokens + excluded.good_cached_prompt_tokens,
    good_generated_tokens = good_generated_tokens + excluded.good_generated_tokens
