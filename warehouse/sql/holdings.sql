-- What the counter tables hold (warehouse/read.py, Holdings): the minute watermark (raw rows before
-- it are in the minute and hour tables), where retention left the raw and the minute rows, and the
-- longest interval a raw row covers, and whether the file keeps the pool and six-minute rollups.
SELECT max(through) FILTER (WHERE name = '1m') AS through,
       max(through) FILTER (WHERE name = 'increments_from') AS raw_from,
       max(through) FILTER (WHERE name = 'increments_1m_from') AS minutes_from,
       (SELECT max(seconds) FROM longest_interval) AS longest,
       count(*) FILTER (WHERE name = 'pool_histograms') > 0 AS pooled,
       count(*) FILTER (WHERE name = 'increments_6m') > 0 AS sixes
FROM rollup_state
