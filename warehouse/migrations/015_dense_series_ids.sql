-- Series ids were a 64-bit hash of (target, name, labels): eight incompressible bytes in every raw
-- and rolled-up row, two thirds of a raw sample's size on disk. From now on the writer numbers
-- series 1, 2, 3, ... in the order it first stores them (a target's page order), so a round's ids
-- rise by one from row to row and DuckDB packs them into almost nothing; the hash stays as
-- `series_key`, how the writer recognises a series it has stored (warehouse/ingest.py).
--
-- This renumbers an existing file the same way: each series by its place in its target's last
-- scrape (the order the writer stored it in), series no longer scraped after them; then rewrites
-- every table that holds series ids, rows in time and id order.
CREATE TEMP TABLE dense_ids AS
WITH last AS (SELECT target, max(ts) AS ts FROM scrapes GROUP BY target),
placed AS (
    SELECT x.series_id, min(x.rowid) AS at
    FROM samples x JOIN series s USING (series_id) JOIN last l ON l.target = s.target AND l.ts = x.ts
    WHERE x.ts >= (SELECT min(ts) FROM last)
    GROUP BY x.series_id
)
SELECT s.series_id AS old, row_number() OVER (ORDER BY p.at NULLS LAST, s.target, s.metric, s.labels, s.le) AS new
FROM series s LEFT JOIN placed p USING (series_id);

CREATE TEMP TABLE hashed_series AS SELECT * FROM series;
DROP TABLE series;
CREATE TABLE series (
    series_id   BIGINT PRIMARY KEY,  -- 1, 2, 3, ... in the order the writer first stored each series
    target      VARCHAR NOT NULL,
    metric      VARCHAR NOT NULL,    -- sample name, e.g. vllm:ttft_seconds_bucket
    family      VARCHAR NOT NULL,    -- metric family name as the parser gives it
    kind        VARCHAR NOT NULL,    -- counter | gauge | histogram | summary | info | stateset | unknown ...
    labels      VARCHAR NOT NULL,    -- JSON object of the labels except le, keys sorted
    engine      VARCHAR,             -- vLLM data-parallel rank, when labelled
    le          DOUBLE,              -- histogram bucket upper bound, when a bucket
    series_key  BIGINT NOT NULL      -- 64-bit hash of (target, name, labels as scraped): the series' identity
);
CREATE UNIQUE INDEX series_by_key ON series (series_key);
INSERT INTO series BY NAME
SELECT d.new AS series_id, h.series_id AS series_key, h.* EXCLUDE (series_id)
FROM hashed_series h JOIN dense_ids d ON d.old = h.series_id ORDER BY d.new;
DROP TABLE hashed_series;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM samples x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM samples;
INSERT INTO samples BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM increments x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM increments;
INSERT INTO increments BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM samples_1m x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM samples_1m;
INSERT INTO samples_1m BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM increments_1m x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM increments_1m;
INSERT INTO increments_1m BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM samples_1h x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM samples_1h;
INSERT INTO samples_1h BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

CREATE TEMP TABLE renumbered AS
SELECT x.ts, d.new AS series_id, x.* EXCLUDE (ts, series_id) FROM increments_1h x JOIN dense_ids d ON d.old = x.series_id;
DELETE FROM increments_1h;
INSERT INTO increments_1h BY NAME SELECT * FROM renumbered ORDER BY ts, series_id;
DROP TABLE renumbered;

DROP TABLE dense_ids;
CREATE OR REPLACE VIEW series_targets AS
    SELECT s.*, t.role, t.gpus, t.hostname FROM series s JOIN targets t ON s.target = t.name;
