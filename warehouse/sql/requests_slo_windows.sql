-- Per window, finishing hour, SLO class and tenant: requests_slo.sql's sums for each of up to eight
-- windows that end together, in one read (a report's window, its burn windows and its classes'
-- periods: warehouse/goodput.py, slo_sums_ending). Window k (1, 2, ...) is [$edges_starts[k],
-- $edges_end): its whole hours [$finished_froms[k], $finished_untils[k]) from requests_slo_1h, its
-- whole minutes around them, from $minutes_froms[k] to $minutes_untils[k], from requests_slo_1m,
-- and from the records its edges and the requests that neither holds yet: what requests_slo.sql
-- gives for one window with those bounds (goodput.slo_window), with no ingested bounds. Each record
-- is judged once, however many windows count it. Each window's start edge is a scan of its own,
-- which skips the blocks that hold none of it: one scan of eight ranges would read every record
-- between them. Unused slots are NULL (no rows); warehouse/goodput.py reads as many windows at once as
-- there are slots.
WITH slo_windows AS (
    SELECT unnest(range(1, len($edges_starts::TIMESTAMP[]) + 1)) AS k,
           unnest($edges_starts::TIMESTAMP[]) AS edges_start, unnest($minutes_froms::TIMESTAMP[]) AS minutes_from,
           unnest($finished_froms::TIMESTAMP[]) AS finished_from,
           unnest($finished_untils::TIMESTAMP[]) AS finished_until,
           unnest($minutes_untils::TIMESTAMP[]) AS minutes_until
),
slo_hours AS (  -- each window's whole hours
    SELECT k, unnest(range(finished_from, finished_until, INTERVAL 1 HOUR)) AS ts FROM slo_windows
),
slo_minutes AS (  -- each window's whole minutes around its hours (few: the join hands them to the scan)
    SELECT k, unnest(range(minutes_from, finished_from, INTERVAL 1 MINUTE)) AS ts FROM slo_windows
    UNION ALL
    SELECT k, unnest(range(finished_until, minutes_until, INTERVAL 1 MINUTE)) FROM slo_windows
),
/*requests_slo_rolled*/
picked AS (  -- every record a window reads from the records, once (by its row: a gateway's new log
    -- numbers its records from 1 again, so gateway and seq do not name one)
    SELECT DISTINCT ON (rid) finished_at, ingested_at, user_id, tenant, outcome, stream,
           prompt_tokens, coalesce(cached_prompt_tokens, 0) AS cached, generated_tokens, ttft_seconds,
           itl_mean_seconds, e2e_seconds, slo_ttft_seconds, slo_itl_seconds
    FROM (SELECT rowid AS rid, * FROM requests  -- in a window's hours, not rolled up yet
          WHERE ingested_at >= (SELECT since FROM slo_hours_rolled)
            -- from the first hour to the last of the windows that have any
            AND finished_at >= list_min(list_transform(list_zip($finished_froms::TIMESTAMP[], $finished_untils::TIMESTAMP[]),
                                                       h -> CASE WHEN h[1] < h[2] THEN h[1] END))
            AND finished_at < list_max(list_transform(list_zip($finished_froms::TIMESTAMP[], $finished_untils::TIMESTAMP[]),
                                                      h -> CASE WHEN h[1] < h[2] THEN h[2] END))
          UNION ALL
          SELECT rowid AS rid, * FROM requests  -- in a window's minutes, not rolled up yet
          WHERE ingested_at >= (SELECT since FROM slo_minutes_rolled)
            AND finished_at >= list_min($minutes_froms::TIMESTAMP[]) AND finished_at < $edges_end::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests  -- the windows' end edge
          WHERE finished_at >= list_min($minutes_untils::TIMESTAMP[]) AND finished_at < $edges_end::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[1]::TIMESTAMP AND finished_at < $minutes_froms[1]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[2]::TIMESTAMP AND finished_at < $minutes_froms[2]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[3]::TIMESTAMP AND finished_at < $minutes_froms[3]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[4]::TIMESTAMP AND finished_at < $minutes_froms[4]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[5]::TIMESTAMP AND finished_at < $minutes_froms[5]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[6]::TIMESTAMP AND finished_at < $minutes_froms[6]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[7]::TIMESTAMP AND finished_at < $minutes_froms[7]::TIMESTAMP
          UNION ALL
          SELECT rowid AS rid, * FROM requests
          WHERE finished_at >= $edges_starts[8]::TIMESTAMP AND finished_at < $minutes_froms[8]::TIMESTAMP)
),
/*request_slo_judged*/,
slo_counted AS (  -- each judged record in each window that reads it from the records
    SELECT w.k, j.* FROM judged j JOIN slo_windows w
        ON j.finished_at >= w.edges_start AND j.finished_at < $edges_end::TIMESTAMP
       AND (j.finished_at < w.minutes_from OR j.finished_at >= w.minutes_until  -- an edge
            OR (j.finished_at >= w.finished_from AND j.finished_at < w.finished_until
                AND j.ingested_at >= (SELECT since FROM slo_hours_rolled))  -- in an hour, not rolled up yet
            OR (NOT (j.finished_at >= w.finished_from AND j.finished_at < w.finished_until)
                AND j.ingested_at >= (SELECT since FROM slo_minutes_rolled)))  -- in a minute, not yet
)
SELECT k, time_bucket(INTERVAL 1 HOUR, ts) AS ts, class, tenant, sum(COLUMNS(* EXCLUDE (k, ts, class, tenant)))::BIGINT
FROM (
    SELECT h.k, x.* FROM requests_slo_1h x JOIN slo_hours h USING (ts)
    UNION ALL BY NAME
    -- a lake's rows published before migration 023 have no tenant or sums: its minutes are not read
    SELECT m.k, x.* FROM requests_slo_1m x JOIN slo_minutes m USING (ts) WHERE x.requests IS NOT NULL
    UNION ALL BY NAME
    SELECT k, time_bucket(INTERVAL 1 MINUTE, finished_at) AS ts, coalesce(slo_class, '') AS class, tenant,
    /*requests_slo_counts*/
    FROM slo_counted
    GROUP BY ALL
)
GROUP BY ALL
ORDER BY k, ts, class, tenant
