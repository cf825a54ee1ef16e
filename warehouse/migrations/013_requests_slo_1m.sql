-- Per finishing minute and SLO class: the requests held to the class's objective and those that
-- met every target, rolled up from the records as they are stored, for the alert banner's burn
-- rates (warehouse/alerts.py: 6 hours at minute resolution, which the records would take seconds
-- to judge on a busy rack). Kept as long as the records.
CREATE TABLE IF NOT EXISTS requests_slo_1m (
    ts     TIMESTAMP NOT NULL,  -- minute of finished_at
    class  VARCHAR NOT NULL,    -- '' for requests finished before any class was in effect
    held   BIGINT NOT NULL,
    met    BIGINT NOT NULL,
    PRIMARY KEY (ts, class)
);
