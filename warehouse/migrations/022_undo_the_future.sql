-- Before the clock guards (moemeter.contract.clock.MAX_AHEAD, moemeter.contract.columns.MAX_REQUEST_TOKENS), a
-- Prometheus source's point 40 days ahead moved the rollup watermarks there: retention deleted
-- what was older and every later counter reading was refused as late until the clock caught up.
-- One gateway record of 2^62 prompt tokens made the hourly request roll-up overflow in every later
-- round. The guards keep new input out; this takes out what such input already left: every row
-- dated more than 5 minutes past the migration's clock, every request record counting more tokens
-- than one request holds (2^31 - 1), and the watermarks past the clock, which go back to it (the
-- minutes and hours after them are rolled up again as they close). Each removal is counted in
-- `rejected`. What retention deleted is gone; a file never attacked loses nothing.
CREATE TEMP TABLE m022_now AS SELECT (current_timestamp AT TIME ZONE 'UTC')::TIMESTAMP AS now;
CREATE TEMP TABLE m022_cutoff AS SELECT now + INTERVAL 5 MINUTE AS t FROM m022_now;

INSERT INTO rejected
SELECT (SELECT now FROM m022_now), gateway, 'request',
       'a record counting more tokens than one request holds, or finishing after the clock: removed by migration 022',
       count(*)
FROM requests
WHERE prompt_tokens > 2147483647 OR generated_tokens > 2147483647 OR cached_prompt_tokens > 2147483647
   OR finished_at > (SELECT t FROM m022_cutoff) OR ingested_at > (SELECT t FROM m022_cutoff)
GROUP BY gateway;
DELETE FROM requests
WHERE prompt_tokens > 2147483647 OR generated_tokens > 2147483647 OR cached_prompt_tokens > 2147483647
   OR finished_at > (SELECT t FROM m022_cutoff) OR ingested_at > (SELECT t FROM m022_cutoff);

INSERT INTO rejected
SELECT (SELECT now FROM m022_now), target, 'scrape', 'a scrape dated after the clock: removed by migration 022', count(*)
FROM scrapes WHERE ts > (SELECT t FROM m022_cutoff) GROUP BY target;

DELETE FROM samples WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM increments WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM scrapes WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM samples_1m WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM samples_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM increments_1m WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM increments_6m WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM increments_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM pool_histograms_1m WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM pool_histograms_6m WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM pool_histograms_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM expert_load WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM expert_load_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM expert_snapshots WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM expert_placement WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM eplb_rebalances WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM requests_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM requests_itl_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM requests_slo_1h WHERE ts > (SELECT t FROM m022_cutoff);
DELETE FROM requests_slo_1m WHERE ts > (SELECT t FROM m022_cutoff);

UPDATE targets SET last_seen = (SELECT now FROM m022_now) WHERE last_seen > (SELECT t FROM m022_cutoff);
UPDATE targets SET first_seen = last_seen WHERE first_seen > last_seen;
-- The SLO rules' versions start where the newest stored request finished (migrations 020, 021):
-- never past the clock.
UPDATE slo_rules SET since = (SELECT now FROM m022_now) WHERE since > (SELECT t FROM m022_cutoff);
-- The roll-ups' watermarks, and where retention's cut lies, never past the clock (warehouse/rollup.py).
UPDATE rollup_state SET through = (SELECT time_bucket(INTERVAL 1 MINUTE, now) FROM m022_now)
WHERE name IN ('1m', 'requests_slo_1m', 'increments_from', 'increments_1m_from')
  AND through > (SELECT t FROM m022_cutoff);
UPDATE rollup_state SET through = (SELECT time_bucket(INTERVAL 1 HOUR, now) FROM m022_now)
WHERE name = '1h' AND through > (SELECT t FROM m022_cutoff);

DROP TABLE m022_cutoff;
DROP TABLE m022_now;
