-- The SLO sums' watermarks, as CTEs: the records stored before slo_minutes_rolled are in
-- requests_slo_1m, those stored before slo_hours_rolled in requests_slo_1h (the hourly roll-up's).
slo_minutes_rolled AS (
    SELECT coalesce(max(through), '-infinity'::TIMESTAMP) AS since FROM rollup_state WHERE name = 'requests_slo_1m'
),
slo_hours_rolled AS (
    SELECT coalesce(max(through), '-infinity'::TIMESTAMP) AS since FROM rollup_state WHERE name = '1h'
),
