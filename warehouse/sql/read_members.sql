-- (a pooled statement's members, warehouse/read.py) the histogram and summary series of the picked
-- pools, keyed by pool: a join of the few picked, not a key for every row
members AS (SELECT series_id, /*pool_key*/ AS pool FROM series_targets
            WHERE kind IN ('histogram', 'summary') AND pool IN (SELECT series_id FROM picked)),
