-- Per-expert data from EPLB snapshots (the moemeter plugin's /moemeter/experts, or the twin's).
CREATE TABLE IF NOT EXISTS expert_snapshots (
    ts         TIMESTAMP NOT NULL,  -- snapshot time (collector clock), UTC
    target     VARCHAR NOT NULL,
    seconds    DOUBLE,              -- interval since the previous snapshot; NULL for a first one
    layers     INTEGER NOT NULL,
    experts    INTEGER NOT NULL,    -- logical experts per layer
    slots      INTEGER NOT NULL,    -- physical expert slots per layer
    ranks      INTEGER NOT NULL,    -- EP ranks (slots / ranks per rank)
    reset      BOOLEAN NOT NULL     -- counters went down: a restart, tokens count from zero
);

CREATE TABLE IF NOT EXISTS expert_load (
    ts      TIMESTAMP NOT NULL,     -- snapshot that closed the interval
    target  VARCHAR NOT NULL,
    layer   SMALLINT NOT NULL,
    expert  SMALLINT NOT NULL,      -- logical expert
    tokens  DOUBLE NOT NULL         -- tokens routed to it in the interval (top-k counted)
);

CREATE TABLE IF NOT EXISTS expert_placement (
    ts      TIMESTAMP NOT NULL,     -- first snapshot that showed this placement
    target  VARCHAR NOT NULL,
    layer   SMALLINT NOT NULL,
    slot    SMALLINT NOT NULL,      -- physical slot; on rank slot // (slots / ranks)
    rank    SMALLINT NOT NULL,
    expert  SMALLINT NOT NULL       -- logical expert held in the slot
);

CREATE TABLE IF NOT EXISTS eplb_rebalances (
    ts                    TIMESTAMP NOT NULL,  -- when the rebalance finished (exporter clock), UTC
    target                VARCHAR NOT NULL,
    duration_seconds      DOUBLE NOT NULL,
    moved_replicas        INTEGER NOT NULL,
    layer                 SMALLINT NOT NULL,
    balancedness_before   DOUBLE,              -- the planned-on window under the old placement
    balancedness_planned  DOUBLE,              -- the same window under the new placement
    PRIMARY KEY (target, ts, layer)
);
