-- SLO sheets, versioned by effective time; rows are only ever added (a target in effect is not edited).
CREATE TABLE IF NOT EXISTS slo_classes (
    effective     TIMESTAMP NOT NULL,  -- UTC; in effect until the next entry of the same class
    class         VARCHAR NOT NULL,
    ttft_seconds  DOUBLE,              -- NULL: no time-to-first-token target
    itl_seconds   DOUBLE,              -- NULL: no mean inter-token latency target
    e2e_seconds   DOUBLE,              -- NULL: no end-to-end target
    objective     DOUBLE NOT NULL,     -- share of requests that must meet every target
    period_days   DOUBLE NOT NULL,     -- the objective's period, for the error budget
    is_default    BOOLEAN NOT NULL,    -- the class of users and tenants assigned to none
    sheet         VARCHAR NOT NULL,
    source        VARCHAR NOT NULL,
    loaded_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (class, effective)
);

CREATE TABLE IF NOT EXISTS slo_assignments (
    effective  TIMESTAMP NOT NULL,
    kind       VARCHAR NOT NULL,       -- user | tenant (a user's own assignment wins)
    name       VARCHAR NOT NULL,
    class      VARCHAR NOT NULL,
    sheet      VARCHAR NOT NULL,
    loaded_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (kind, name, effective)
);
