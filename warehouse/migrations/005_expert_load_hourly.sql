-- Per-expert load downsampled to hours, for ranges past the raw retention: the sum of the
-- snapshots' tokens whose interval closed in the hour.
CREATE TABLE IF NOT EXISTS expert_load_1h (
    ts         TIMESTAMP NOT NULL,  -- hour start
    target     VARCHAR NOT NULL,
    layer      SMALLINT NOT NULL,
    expert     SMALLINT NOT NULL,
    tokens     DOUBLE NOT NULL,
    snapshots  INTEGER NOT NULL     -- snapshots summed
);
-- Databases from before this migration: their whole hours of snapshots, once.
INSERT INTO expert_load_1h
SELECT time_bucket(INTERVAL 1 HOUR, l.ts), l.target, l.layer, l.expert, sum(l.tokens), count(*)
FROM expert_load l, rollup_state r
WHERE r.name = '1h' AND l.ts < r.through
GROUP BY ALL;
