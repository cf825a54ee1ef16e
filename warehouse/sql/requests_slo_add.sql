-- The SET list that adds a roll's SLO sums (requests_slo_minutes.sql's columns) to a stored row's.
    requests = requests + excluded.requests, held = held + excluded.held, met = met + excluded.met,
    failed = failed + excluded.failed, missed_ttft = missed_ttft + excluded.missed_ttft,
    missed_itl = missed_itl + excluded.missed_itl, missed_e2e = missed_e2e + excluded.missed_e2e,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
    generated_tokens = generated_tokens + excluded.generated_tokens,
    good_prompt_tokens = good_prompt_tokens + excluded.good_prompt_tokens,
    good_cached_prompt_tokens = good_cached_prompt_tokens + excluded.good_cached_prompt_tokens,
    good_generated_tokens = good_generated_tokens + excluded.good_generated_tokens
