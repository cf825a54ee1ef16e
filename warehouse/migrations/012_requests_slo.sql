-- Per finishing hour, SLO class and tenant: the requests held to the class's objective, those that
-- met every target, what the others missed, and the tokens of both (docs/definitions.md, "SLOs").
-- Rolled up from the records as the hour's requests are stored; the SLO entries in effect then are
-- never changed afterwards (warehouse/slo.py refuses an entry effective before a stored request),
-- so these rows and the records they came from always agree.
CREATE TABLE IF NOT EXISTS requests_slo_1h (
    ts                         TIMESTAMP NOT NULL,  -- hour of finished_at
    class                      VARCHAR NOT NULL,    -- '' for requests finished before any class was in effect
    tenant                     VARCHAR NOT NULL,
    requests                   BIGINT NOT NULL,     -- every request, held or not (they share the pools' cost)
    held                       BIGINT NOT NULL,     -- answered, or failed on the server side
    met                        BIGINT NOT NULL,     -- answered within every target
    failed                     BIGINT NOT NULL,     -- held, failed on the server side
    missed_ttft                BIGINT NOT NULL,     -- answered, over the time-to-first-token target
    missed_itl                 BIGINT NOT NULL,     -- answered, over the mean inter-token latency target
    missed_e2e                 BIGINT NOT NULL,     -- answered, over the end-to-end target
    prompt_tokens              BIGINT NOT NULL,
    cached_prompt_tokens       BIGINT NOT NULL,
    generated_tokens           BIGINT NOT NULL,
    good_prompt_tokens         BIGINT NOT NULL,     -- of the requests that met every target
    good_cached_prompt_tokens  BIGINT NOT NULL,
    good_generated_tokens      BIGINT NOT NULL,
    PRIMARY KEY (ts, class, tenant)
);
