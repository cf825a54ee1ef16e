-- Per-request records from the metering gateways' feeds, the feed cursors, and hourly per-user sums.
CREATE TABLE IF NOT EXISTS requests (
    gateway                   VARCHAR NOT NULL,   -- target name of the gateway that recorded it
    seq                       BIGINT NOT NULL,    -- its position in that gateway's log
    request_id                VARCHAR NOT NULL,   -- the X-Request-Id the gateway passed upstream
    started_at                TIMESTAMP NOT NULL, -- request received, UTC
    finished_at               TIMESTAMP NOT NULL, -- response ended, UTC
    ingested_at               TIMESTAMP NOT NULL, -- collector round that stored it (rollups follow this)
    user_id                   VARCHAR NOT NULL,
    tenant                    VARCHAR NOT NULL,
    model                     VARCHAR NOT NULL,
    endpoint                  VARCHAR NOT NULL,   -- completions | chat/completions
    stream                    BOOLEAN NOT NULL,
    status                    INTEGER NOT NULL,   -- HTTP status the client got; 499 = client went away
    outcome                   VARCHAR NOT NULL,   -- ok, or the error class
    prompt_tokens             BIGINT NOT NULL,
    cached_prompt_tokens      BIGINT,             -- NULL when the upstream did not say
    generated_tokens          BIGINT NOT NULL,
    ttft_seconds              DOUBLE,
    itl_mean_seconds          DOUBLE,             -- per-user tokens/s = 1 / this
    itl_max_seconds           DOUBLE,
    decode_tokens_per_second  DOUBLE,
    e2e_seconds               DOUBLE NOT NULL,
    usage_reported            BOOLEAN NOT NULL    -- counts from the upstream's usage, not counted chunks
);

CREATE TABLE IF NOT EXISTS request_feeds (
    gateway     VARCHAR PRIMARY KEY,
    log_id      VARCHAR NOT NULL,   -- the gateway's log file; a new one restarts the cursor
    seq         BIGINT NOT NULL,    -- last record stored (committed with the records)
    records     BIGINT NOT NULL,    -- records stored from this gateway
    lost        BIGINT NOT NULL,    -- records the gateway dropped from its log before they were read
    rejected    BIGINT NOT NULL,    -- malformed records refused
    updated_at  TIMESTAMP NOT NULL
);

CREATE TABLE IF NOT EXISTS requests_1h (
    ts                    TIMESTAMP NOT NULL,  -- hour of finished_at
    user_id               VARCHAR NOT NULL,
    tenant                VARCHAR NOT NULL,
    model                 VARCHAR NOT NULL,
    requests              BIGINT NOT NULL,
    errors                BIGINT NOT NULL,     -- outcome other than ok
    prompt_tokens         BIGINT NOT NULL,
    cached_prompt_tokens  BIGINT NOT NULL,
    generated_tokens      BIGINT NOT NULL,
    timed                 BIGINT NOT NULL,     -- requests with a mean inter-token latency
    itl_sum_seconds       DOUBLE NOT NULL,
    ttft_sum_seconds      DOUBLE NOT NULL,
    e2e_sum_seconds       DOUBLE NOT NULL,
    PRIMARY KEY (ts, user_id, tenant, model)
);

-- Per-hour histogram of per-request mean inter-token latency, all users: bins of 1% width
-- (bin = round(100 * ln(seconds))), so P50/P90 per-user tokens/s over days come within 0.5%.
CREATE TABLE IF NOT EXISTS requests_itl_1h (
    ts        TIMESTAMP NOT NULL,  -- hour of finished_at
    bin       INTEGER NOT NULL,
    requests  BIGINT NOT NULL,
    PRIMARY KEY (ts, bin)
);
