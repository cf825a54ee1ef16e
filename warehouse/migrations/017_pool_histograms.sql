-- A day's latency histograms on the Live page summed 7,272 bucket series (every engine's every
-- bucket) over 1,440 minutes, about two rows a minute each, to give 202 counts per step: one per
-- pool, sample name and bucket bound. These tables hold such sums as the minute and hour rollups
-- close, for every histogram and summary series (buckets, sums and counts): one row per minute
-- (hour), pool (the targets' role when the minute rolled up), sample name and bucket bound (NULL
-- for a sum or a count), with the member series' increases, covered seconds and idle seconds summed. The read
-- layer serves a pooled statement from them (warehouse/read.py) for whole minutes and hours and
-- from the raw rows for the edges of its window, so it gives the per-series rollups' numbers.
--
-- This fills them from the per-series rollups already there.
CREATE TABLE IF NOT EXISTS pool_histograms_1m (
    ts            TIMESTAMP NOT NULL,  -- minute start
    role          VARCHAR NOT NULL,    -- the pool: its targets' role
    metric        VARCHAR NOT NULL,    -- sample name, e.g. vllm:time_to_first_token_seconds_bucket
    le            DOUBLE,              -- bucket upper bound; NULL for a sum or a count
    delta         DOUBLE NOT NULL,     -- sums over the pool's series of increments_1m's columns
    seconds       DOUBLE NOT NULL,
    idle_seconds  DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_histograms_1h (
    ts            TIMESTAMP NOT NULL,  -- hour start
    role          VARCHAR NOT NULL,
    metric        VARCHAR NOT NULL,
    le            DOUBLE,
    delta         DOUBLE NOT NULL,     -- sums over the pool's series of increments_1h's columns
    seconds       DOUBLE NOT NULL,
    idle_seconds  DOUBLE NOT NULL
);

INSERT INTO pool_histograms_1m
SELECT x.ts, t.role, s.metric, s.le, sum(x.delta), sum(x.seconds), sum(x.idle_seconds)
FROM increments_1m x JOIN series s USING (series_id) JOIN targets t ON t.name = s.target
WHERE s.kind IN ('histogram', 'summary') GROUP BY ALL ORDER BY ALL;

INSERT INTO pool_histograms_1h
SELECT x.ts, t.role, s.metric, s.le, sum(x.delta), sum(x.seconds), sum(x.idle_seconds)
FROM increments_1h x JOIN series s USING (series_id) JOIN targets t ON t.name = s.target
WHERE s.kind IN ('histogram', 'summary') GROUP BY ALL ORDER BY ALL;

-- the read layer serves pooled statements from these tables where this row is (a lake's racks
-- have no pool tables: it reads the per-series rollups there)
INSERT INTO rollup_state VALUES ('pool_histograms', TIMESTAMP '1970-01-01') ON CONFLICT (name) DO NOTHING;
