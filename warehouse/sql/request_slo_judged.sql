-- CTEs after a `picked` of request records (finished_at, user_id, tenant, outcome, stream,
-- prompt_tokens, cached, generated_tokens, ttft_seconds, itl_mean_seconds, e2e_seconds,
-- slo_ttft_seconds, slo_itl_seconds; any other column is carried along), ending in `judged`: each
-- with its SLO class and verdict as request_slo.sql's header says (its picked and this chain).
slo_points AS (  -- where any class version or assignment starts: between two, every request is judged alike
    SELECT effective AS since FROM slo_classes UNION SELECT effective FROM slo_assignments
),
slo_epoch AS (  -- each request with the latest point at or before it finished (NULL: before any)
    SELECT r.*, e.since AS epoch FROM picked r ASOF LEFT JOIN slo_points e ON r.finished_at >= e.since
),
slo_live AS (  -- each class's version in effect at each point
    SELECT p.since, c.* FROM slo_points p JOIN slo_classes c ON c.effective <= p.since
    QUALIFY row_number() OVER (PARTITION BY p.since, c.class ORDER BY c.effective DESC) = 1
),
slo_default AS (  -- from each point on: of the classes in effect, the latest that says default
    SELECT * FROM slo_live WHERE is_default
    QUALIFY row_number() OVER (PARTITION BY since ORDER BY effective DESC, class) = 1
),
slo_named AS (  -- resolved once per user, tenant and epoch, not per request
    SELECT k.*, coalesce(u.class, t.class) AS assigned
    FROM (SELECT DISTINCT user_id, tenant, epoch FROM slo_epoch WHERE epoch IS NOT NULL) k
    ASOF LEFT JOIN (SELECT tenant, name, effective, class FROM slo_assignments WHERE kind = 'user') u
        ON u.tenant = k.tenant AND u.name = k.user_id AND k.epoch >= u.effective
    ASOF LEFT JOIN (SELECT name, effective, class FROM slo_assignments WHERE kind = 'tenant') t
        ON t.name = k.tenant AND k.epoch >= t.effective
),
slo_class_of AS (
    SELECT n.user_id, n.tenant, n.epoch, coalesce(c.class, d.class) AS slo_class,
           CASE WHEN c.class IS NULL THEN d.ttft_seconds ELSE c.ttft_seconds END AS ttft,
           CASE WHEN c.class IS NULL THEN d.itl_seconds ELSE c.itl_seconds END AS itl,
           CASE WHEN c.class IS NULL THEN d.e2e_seconds ELSE c.e2e_seconds END AS e2e,
           coalesce(CASE WHEN c.class IS NULL THEN d.own_targets ELSE c.own_targets END, false) AS own_targets
    FROM slo_named n
    ASOF LEFT JOIN slo_classes c ON c.class = n.assigned AND n.epoch >= c.effective
    ASOF LEFT JOIN slo_default d ON n.epoch >= d.since
),
slo_rules_since AS (  -- each version of the rules judges the requests that finished after its `since`;
    -- version 3 not stored (a read-only file without migration 021): the rules it was rolled up by
    SELECT coalesce(max(since) FILTER (WHERE version = 2), '-infinity'::TIMESTAMP) AS since_2,
           coalesce(max(since) FILTER (WHERE version = 3), 'infinity'::TIMESTAMP) AS since_3
    FROM slo_rules
),
slo_targets AS (
    SELECT r.*, k.slo_class, k.slo_class IS NOT NULL AS classed, r.finished_at > s.since_2 AS rules_2,
           -- when its first token reached the client: a non-streamed one's came with the whole answer
           CASE WHEN r.stream OR r.finished_at <= s.since_3 THEN r.ttft_seconds ELSE r.e2e_seconds END
               AS first_token_seconds,
           CASE WHEN k.own_targets OR NOT rules_2 THEN coalesce(r.slo_ttft_seconds, k.ttft)
                ELSE least(r.slo_ttft_seconds, k.ttft) END AS ttft_target,
           CASE WHEN k.own_targets OR NOT rules_2 THEN coalesce(r.slo_itl_seconds, k.itl)
                ELSE least(r.slo_itl_seconds, k.itl) END AS itl_target,
           k.e2e AS e2e_target,
           rules_2 AND r.outcome = 'client_disconnect' AS abandoned  -- before the answer was delivered
    FROM slo_epoch r CROSS JOIN slo_rules_since s
    LEFT JOIN slo_class_of k ON k.user_id = r.user_id AND k.tenant = r.tenant AND k.epoch = r.epoch
),
slo_over AS (  -- over each target: answered late, or abandoned after waiting past it (no token yet: TTFT)
    SELECT *, (outcome = 'ok' OR abandoned)
              AND coalesce(first_token_seconds > ttft_target, abandoned AND e2e_seconds > ttft_target, false)
              AS over_ttft,
           (outcome = 'ok' OR abandoned) AND coalesce(itl_mean_seconds > itl_target, false) AS over_itl,
           (outcome = 'ok' OR abandoned) AND coalesce(e2e_seconds > e2e_target, false) AS over_e2e
    FROM slo_targets
),
slo_held AS (
    SELECT *, classed AND (outcome = 'ok' OR list_contains($server_faults, outcome)
                           OR (abandoned AND (over_ttft OR over_itl OR over_e2e))) AS held
    FROM slo_over
),
slo_missed AS (
    SELECT *, held AND over_ttft AS missed_ttft, held AND over_itl AS missed_itl, held AND over_e2e AS missed_e2e
    FROM slo_held
),
judged AS (
    SELECT *, held AND outcome = 'ok' AND NOT (missed_ttft OR missed_itl OR missed_e2e) AS met FROM slo_missed
)
