-- Issue #51. A request's end-to-end time is stored as what is left of it once its time to first
-- token and its decode time (the mean ITL times its generated tokens less one: the first token to
-- the last) are taken away: the time from the last token to the response's end, and rounding. At
-- the twin's mix that is -4..5 us and packs in 0.5 bytes a record, where e2e in microseconds took
-- 3.3 (docs/operations.md, "Where a request record's bytes go"); on a real gateway it is the tail
-- after the last token, milliseconds; a record without a mean ITL (not streamed, or one token)
-- keeps its whole e2e. `e2e_us` is computed from it as it is read, exactly: the decode time is
-- whole microseconds, the nearest (halves up), in BIGINT arithmetic where it cannot overflow (a
-- mean ITL under 4.3 s, fewer than 2^31 tokens) and else in HUGEINT, kept from 0 to 1e17 us (3,000
-- years) so that the remainder of a record whose counts are hostile still fits a BIGINT (a stored
-- TTFT is at most 9e18 us: migration 024). The same expression is in
-- warehouse/sql/requests_insert.sql; it is written out, not a macro, because a macro is looked up
-- in the reader's default catalog, and a session that ATTACHes the warehouse could not read e2e.
CREATE TABLE requests_e2e_rest (
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
    e2e_rest_us               BIGINT NOT NULL,    -- e2e less the TTFT and the decode time
    usage_reported            BOOLEAN NOT NULL,   -- counts from the upstream's usage, not counted chunks
    slo_ttft_seconds          DOUBLE,             -- the request's own targets (migration 011)
    slo_itl_seconds           DOUBLE,
    e2e_us                    BIGINT GENERATED ALWAYS AS (
        e2e_rest_us + coalesce(ttft_us, 0)
        + CASE WHEN itl_mean_ns IS NULL THEN 0
               WHEN itl_mean_ns BETWEEN 0 AND 4294967295 AND generated_tokens < 2147483648
               THEN (itl_mean_ns * greatest(generated_tokens - 1, 0) + 500) // 1000
               ELSE least(greatest((itl_mean_ns::HUGEINT * greatest(generated_tokens - 1, 0) + 500) // 1000, 0),
                          100000000000000000)::BIGINT END) VIRTUAL,
    request_id                VARCHAR GENERATED ALWAYS AS (request_id_text || coalesce(request_id_number::VARCHAR, '')) VIRTUAL,
    started_at                TIMESTAMP GENERATED ALWAYS AS (finished_at - to_microseconds(e2e_us)) VIRTUAL,
    ttft_seconds              DOUBLE GENERATED ALWAYS AS (ttft_us / 1000000) VIRTUAL,
    itl_mean_seconds          DOUBLE GENERATED ALWAYS AS (itl_mean_ns / 1000000000) VIRTUAL,  -- per-user tokens/s = 1 / this
    itl_max_seconds           DOUBLE GENERATED ALWAYS AS (itl_max_us / 1000000) VIRTUAL,
    decode_tokens_per_second  DOUBLE GENERATED ALWAYS AS (1000000000 / nullif(itl_mean_ns, 0)) VIRTUAL,
    e2e_seconds               DOUBLE GENERATED ALWAYS AS (e2e_us / 1000000) VIRTUAL
);
INSERT INTO requests_e2e_rest BY NAME
SELECT * EXCLUDE (e2e_us, request_id, started_at, ttft_seconds, itl_mean_seconds, itl_max_seconds,
                  decode_tokens_per_second, e2e_seconds),
       e2e_us - coalesce(ttft_us, 0)
       - CASE WHEN itl_mean_ns IS NULL THEN 0
              WHEN itl_mean_ns BETWEEN 0 AND 4294967295 AND generated_tokens < 2147483648
              THEN (itl_mean_ns * greatest(generated_tokens - 1, 0) + 500) // 1000
              ELSE least(greatest((itl_mean_ns::HUGEINT * greatest(generated_tokens - 1, 0) + 500) // 1000, 0),
                         100000000000000000)::BIGINT END AS e2e_rest_us
FROM requests;
DROP TABLE requests;
ALTER TABLE requests_e2e_rest RENAME TO requests;
CREATE OR REPLACE VIEW request_records AS
SELECT gateway, seq, request_id, started_at, finished_at, ingested_at, user_id, tenant, model, endpoint, stream,
       status, outcome, prompt_tokens, cached_prompt_tokens, generated_tokens, ttft_seconds, itl_mean_seconds,
       itl_max_seconds, decode_tokens_per_second, e2e_seconds, usage_reported, slo_ttft_seconds, slo_itl_seconds
FROM requests;
