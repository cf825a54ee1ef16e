-- Issue #51. A request record in less than half the bytes (docs/operations.md, "Where a request
-- record's bytes go"). Its four durations were doubles of seconds, which DuckDB packs as ALPRD in
-- 7 bytes each; they are now whole units in integer columns, which it bit-packs: microseconds, the
-- resolution of the record's timestamps, and nanoseconds for the mean inter-token latency, whose
-- inverse is per-user tokens/s (a microsecond would move it by up to 0.05% at 1 ms). The start and
-- the decode speed, which follow from the other columns, are no longer stored. A request id that
-- ends in a number (the twin's `twin-N`, the gateway's count after a prefix) is stored as the text
-- before it and the number, which packs as the sequence does, where the text took 4.7 bytes; one
-- that does not is stored whole, with no number.
-- Every column a report or a person reads keeps its name and type, computed as it is read:
-- `ttft_seconds` and the other seconds from the stored units, `started_at` as finished_at less
-- e2e, `decode_tokens_per_second` as 1 / the mean ITL, `request_id` as its text and number. The
-- seconds read now are those stored, rounded to the nearest unit (halves up). A duration stored
-- before of more than 9e18 units (the feed now refuses any over 9.2e9 s) is kept as 9e18 units, so
-- that it still misses every target it missed. The view request_records gives a record's columns as
-- they were, in their order: what exports write.
CREATE TABLE requests_in_integers (
    gateway                   VARCHAR NOT NULL,   -- target name of the gateway that recorded it
    seq                       BIGINT NOT NULL,    -- its position in that gateway's log
    request_id_text           VARCHAR NOT NULL,   -- the X-Request-Id the gateway passed upstream: its text
    request_id_number         BIGINT,             -- and the number it ends in, without leading zeros
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
    ttft_us                   BIGINT,             -- the durations (NULL: not measured)
    itl_mean_ns               BIGINT,
    itl_max_us                BIGINT,
    e2e_us                    BIGINT NOT NULL,
    usage_reported            BOOLEAN NOT NULL,   -- counts from the upstream's usage, not counted chunks
    slo_ttft_seconds          DOUBLE,             -- the request's own targets (migration 011)
    slo_itl_seconds           DOUBLE,
    request_id                VARCHAR GENERATED ALWAYS AS (request_id_text || coalesce(request_id_number::VARCHAR, '')) VIRTUAL,
    started_at                TIMESTAMP GENERATED ALWAYS AS (finished_at - to_microseconds(e2e_us)) VIRTUAL,
    ttft_seconds              DOUBLE GENERATED ALWAYS AS (ttft_us / 1000000) VIRTUAL,
    itl_mean_seconds          DOUBLE GENERATED ALWAYS AS (itl_mean_ns / 1000000000) VIRTUAL,  -- per-user tokens/s = 1 / this
    itl_max_seconds           DOUBLE GENERATED ALWAYS AS (itl_max_us / 1000000) VIRTUAL,
    decode_tokens_per_second  DOUBLE GENERATED ALWAYS AS (1000000000 / nullif(itl_mean_ns, 0)) VIRTUAL,
    e2e_seconds               DOUBLE GENERATED ALWAYS AS (e2e_us / 1000000) VIRTUAL
);
INSERT INTO requests_in_integers
SELECT gateway, seq, CASE WHEN id.number = '' THEN request_id ELSE id.text END, nullif(id.number, '')::BIGINT,
       finished_at, ingested_at, user_id, tenant, model, endpoint, stream, status, outcome, prompt_tokens,
       cached_prompt_tokens, generated_tokens,
       CASE WHEN ttft_seconds * 1000000 >= 9e18 THEN 9e18 ELSE round(ttft_seconds * 1000000)::BIGINT END,
       CASE WHEN itl_mean_seconds * 1000000000 >= 9e18 THEN 9e18 ELSE round(itl_mean_seconds * 1000000000)::BIGINT END,
       CASE WHEN itl_max_seconds * 1000000 >= 9e18 THEN 9e18 ELSE round(itl_max_seconds * 1000000)::BIGINT END,
       round(e2e_seconds * 1000000)::BIGINT,  -- within the timestamps' span
       usage_reported, slo_ttft_seconds, slo_itl_seconds
FROM (SELECT *, regexp_extract(request_id, '^(.*?)([1-9][0-9]{0,17})$', ['text', 'number']) AS id FROM requests);
DROP TABLE requests;
ALTER TABLE requests_in_integers RENAME TO requests;
CREATE OR REPLACE VIEW request_records AS
SELECT gateway, seq, request_id, started_at, finished_at, ingested_at, user_id, tenant, model, endpoint, stream,
       status, outcome, prompt_tokens, cached_prompt_tokens, generated_tokens, ttft_seconds, itl_mean_seconds,
       itl_max_seconds, decode_tokens_per_second, e2e_seconds, usage_reported, slo_ttft_seconds, slo_itl_seconds
FROM requests;
