-- CTEs ending in `judged` (the judging is request_slo_judged.sql's): each request picked (those of requests_hour_where.sql; those not rolled up
-- into requests_slo_1m yet that finished in [$minutes_from, $finished_from) or [$finished_until,
-- $minutes_until); and those that finished in [$edges_start, $minutes_from) or [$minutes_until,
-- $edges_end), where NULL minutes read [$edges_start, $finished_from) and so on) with the SLO class
-- it is held to and whether it met its targets (docs/definitions.md, "SLOs"): the assignment of its
-- user (of its tenant) in effect when it finished, else its tenant's, else the default class then;
-- the class's version in effect then; its own targets (x-slo-ttft-ms, x-slo-tpot-ms), target by
-- target, where they are tighter than the class's (anywhere if the class says own_targets); a
-- request the client abandoned after it had missed a target is held and missed; a non-streamed
-- request's time to first token is its end-to-end time (its first token arrives with the whole
-- answer), finished or abandoned. A request that finished before a version of these rules
-- (slo_rules) keeps the verdict it was rolled up with: before version 2, its own targets in place
-- of the class's and an abandoned request not held; before version 3, a non-streamed request that
-- finished has no TTFT. $server_faults: the outcomes that are the server side's failure (held,
-- never met).
/*requests_slo_rolled*/
picked AS (
    SELECT finished_at, user_id, tenant, outcome, stream, prompt_tokens,
           coalesce(cached_prompt_tokens, 0) AS cached, generated_tokens, ttft_seconds, itl_mean_seconds,
           e2e_seconds, slo_ttft_seconds, slo_itl_seconds
    -- each of the five its own scan (their finishing times are apart): one condition of five
    -- ranges would read every record the file holds
    FROM (SELECT * FROM requests WHERE /*requests_hour_where*/
          UNION ALL
          SELECT * FROM requests
          WHERE ingested_at >= (SELECT since FROM slo_minutes_rolled)
            AND finished_at >= $minutes_from::TIMESTAMP AND finished_at < $finished_from::TIMESTAMP
          UNION ALL
          SELECT * FROM requests
          WHERE ingested_at >= (SELECT since FROM slo_minutes_rolled)
            AND finished_at >= $finished_until::TIMESTAMP AND finished_at < $minutes_until::TIMESTAMP
          UNION ALL
          SELECT * FROM requests
          WHERE finished_at >= $edges_start::TIMESTAMP
            AND finished_at < coalesce($minutes_from::TIMESTAMP, $finished_from::TIMESTAMP)
          UNION ALL
          SELECT * FROM requests
          WHERE finished_at >= coalesce($minutes_until::TIMESTAMP, $finished_until::TIMESTAMP)
            AND finished_at < $edges_end::TIMESTAMP)
),
/*request_slo_judged*/
