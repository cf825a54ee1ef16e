-- The series that the caller's condition keeps (all of them: TRUE), each named by its key: the
-- series' identity wherever its rows go, the lake and exports (warehouse/export.py, named_by_key).
SELECT * REPLACE (series_key AS series_id) FROM series WHERE /*where*/
