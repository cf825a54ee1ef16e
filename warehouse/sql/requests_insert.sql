-- Appends a page of request records, the Arrow table registered as `_insert_batch` (warehouse/requests.py):
-- each duration in seconds stored as whole microseconds (the mean ITL nanoseconds), the nearest,
-- halves up (migration 024).
INSERT INTO requests BY NAME
SELECT * EXCLUDE (ttft_seconds, itl_mean_seconds, itl_max_seconds, e2e_seconds),
       round(ttft_seconds * 1000000)::BIGINT AS ttft_us,
       round(itl_mean_seconds * 1000000000)::BIGINT AS itl_mean_ns,
       round(itl_max_seconds * 1000000)::BIGINT AS itl_max_us,
       round(e2e_seconds * 1000000)::BIGINT AS e2e_us
FROM _insert_batch
