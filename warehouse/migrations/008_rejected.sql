-- Input refused or repaired on its way in, as data: one row per collector round, target, kind and
-- reason. Whatever else the round brought was stored; the scrape-health view shows these beside it.
CREATE TABLE IF NOT EXISTS rejected (
    ts      TIMESTAMP NOT NULL,  -- the collector round
    target  VARCHAR NOT NULL,
    kind    VARCHAR NOT NULL,    -- series | request | snapshot | round
    reason  VARCHAR NOT NULL,    -- what was wrong, and what was done ("... : refused", "... : replaced")
    count   BIGINT NOT NULL      -- samples, records or snapshots it applies to
);
