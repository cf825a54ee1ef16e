-- Issue #51. The per-minute SLO counts take the hourly sums' columns and key (requests_slo_1h):
-- a report reads a window's partial hours from them, minute by minute, instead of judging every
-- record of those hours again (the SLO page's burn windows and periods each had two such edges).
-- The rows stored before had no tenant and no tokens: they are dropped with the roll-up's
-- watermark, and the roll-up adds every record kept again (warehouse/rollup.py: a file without the
-- watermark rolls from its oldest record), so the table again holds every record's minute.
DROP TABLE requests_slo_1m;
CREATE TABLE requests_slo_1m (
    ts                         TIMESTAMP NOT NULL,  -- minute of finished_at
    class                      VARCHAR NOT NULL,    -- '' for requests finished before any class was in effect
    tenant                     VARCHAR NOT NULL,
    requests                   BIGINT NOT NULL,     -- the columns of requests_slo_1h (migration 012)
    held                       BIGINT NOT NULL,
    met                        BIGINT NOT NULL,
    failed                     BIGINT NOT NULL,
    missed_ttft                BIGINT NOT NULL,
    missed_itl                 BIGINT NOT NULL,
    missed_e2e                 BIGINT NOT NULL,
    prompt_tokens              BIGINT NOT NULL,
    cached_prompt_tokens       BIGINT NOT NULL,
    generated_tokens           BIGINT NOT NULL,
    good_prompt_tokens         BIGINT NOT NULL,
    good_cached_prompt_tokens  BIGINT NOT NULL,
    good_generated_tokens      BIGINT NOT NULL,
    PRIMARY KEY (ts, class, tenant)
);
DELETE FROM rollup_state WHERE name = 'requests_slo_1m';
