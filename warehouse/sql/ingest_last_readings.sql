-- Each series' last reading as the writer keeps it (its time in microseconds since the epoch); the
-- line below is warehouse/sql/last_readings.sql (warehouse/ingest.py).
SELECT series_id, epoch_us(ts) AS us, value FROM (
/*last_readings*/
)
