-- Every known series' key and id: what a writer that restarts numbers pages by.
SELECT series_key, series_id FROM series
