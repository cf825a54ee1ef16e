-- (a statement's gauge samples at raw resolution, warehouse/read.py SAMPLES) the raw samples with
-- the columns of their rollups: a sample is its own mean and max
(SELECT ts, series_id, value, value AS max FROM samples)
