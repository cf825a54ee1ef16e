-- CTEs ending in `judged`: each request picked (those of requests_hour_where.sql, and those that
-- finished in [$edges_start, $finished_from) or [$finished_until, $edges_end)) with the SLO class
-- it is held to and whether it met its targets (docs/definitions.md, "SLOs"): its user's assignment in
-- effect when it finished, else its tenant's, else the default class then; the class's version in
-- effect then; its own targets (x-slo-ttft-ms, x-slo-tpot-ms) in place of the class's, target by
-- target. $server_faults: the outcomes that are the server side's failure (held, never met).
picked AS (
    SELECT finished_at, user_id, tenant, outcome, prompt_tokens, coalesce(cached_prompt_tokens, 0) AS cached,
           generated_tokens, ttft_seconds, itl_mean_seconds, e2e_seconds, slo_ttft_seconds, slo_itl_seconds
    FROM requests
    WHERE (/*requests_hour_where*/)
       OR finished_at >= $edges_start::TIMESTAMP AND finished_at < $finished_from::TIMESTAMP
       OR finished_at >= $finished_until::TIMESTAMP AND finished_at < $edges_end::TIMESTAMP
),
slo_points AS (SELECT DISTINCT effective AS since FROM slo_classes),
slo_live AS (  -- each class's version in effect at each point where any version starts
    SELECT p.since, c.* FROM slo_points p JOIN slo_classes c ON c.effective <= p.since
    QUALIFY row_number() OVER (PARTITION BY p.since, c.class ORDER BY c.effective DESC) = 1
),
slo_default AS (  -- from each point on: of the classes in effect, the latest that says default
    SELECT * FROM slo_live WHERE is_default
    QUALIFY row_number() OVER (PARTITION BY since ORDER BY effective DESC, class) = 1
),
slo_named AS (
    SELECT r.*, coalesce(u.class, t.class) AS assigned
    FROM picked r
    ASOF LEFT JOIN (SELECT name, effective, class FROM slo_assignments WHERE kind = 'user') u
        ON u.name = r.user_id AND r.finished_at >= u.effective
    ASOF LEFT JOIN (SELECT name, effective, class FROM slo_assignments WHERE kind = 'tenant') t
        ON t.name = r.tenant AND r.finished_at >= t.effective
),
slo_held AS (
    SELECT n.*, coalesce(c.class, d.class) AS slo_class,
           coalesce(n.slo_ttft_seconds, CASE WHEN c.class IS NULL THEN d.ttft_seconds ELSE c.ttft_seconds END) AS ttft_target,
           coalesce(n.slo_itl_seconds, CASE WHEN c.class IS NULL THEN d.itl_seconds ELSE c.itl_seconds END) AS itl_target,
           CASE WHEN c.class IS NULL THEN d.e2e_seconds ELSE c.e2e_seconds END AS e2e_target,
           coalesce(c.class, d.class) IS NOT NULL AND (n.outcome = 'ok' OR list_contains($server_faults, n.outcome)) AS held
    FROM slo_named n
    ASOF LEFT JOIN slo_classes c ON c.class = n.assigned AND n.finished_at >= c.effective
    ASOF LEFT JOIN slo_default d ON n.finished_at >= d.since
),
slo_missed AS (
    SELECT *, held AND outcome = 'ok' AND coalesce(ttft_seconds > ttft_target, false) AS missed_ttft,
           held AND outcome = 'ok' AND coalesce(itl_mean_seconds > itl_target, false) AS missed_itl,
           held AND outcome = 'ok' AND coalesce(e2e_seconds > e2e_target, false) AS missed_e2e
    FROM slo_held
),
judged AS (
    SELECT *, held AND outcome = 'ok' AND NOT (missed_ttft OR missed_itl OR missed_e2e) AS met FROM slo_missed
)
