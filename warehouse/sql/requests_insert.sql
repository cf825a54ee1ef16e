-- Appends a page of request records, the Arrow table registered as `_insert_batch` (warehouse/requests.py),
-- as migrations 024 and 025 store one: each duration in seconds as whole microseconds (the mean ITL
-- nanoseconds), the nearest, halves up, and e2e as what is left of it after the TTFT and the decode
-- time (the expression of migration 025's e2e_us); the request id as its text and the number it ends in.
INSERT INTO requests BY NAME
SELECT * EXCLUDE (e2e_us),
       e2e_us - coalesce(ttft_us, 0)
       - CASE WHEN itl_mean_ns IS NULL THEN 0
              WHEN itl_mean_ns BETWEEN 0 AND 4294967295 AND generated_tokens < 2147483648
              THEN (itl_mean_ns * greatest(generated_tokens - 1, 0) + 500) // 1000
              ELSE least(greatest((itl_mean_ns::HUGEINT * greatest(generated_tokens - 1, 0) + 500) // 1000, 0),
                         100000000000000000)::BIGINT END AS e2e_rest_us
FROM (
    SELECT * EXCLUDE (request_id, id, ttft_seconds, itl_mean_seconds, itl_max_seconds, e2e_seconds),
           CASE WHEN id.number = '' THEN request_id ELSE id.text END AS request_id_text,
           nullif(id.number, '')::BIGINT AS request_id_number,
           round(ttft_seconds * 1000000)::BIGINT AS ttft_us,
           round(itl_mean_seconds * 1000000000)::BIGINT AS itl_mean_ns,
           round(itl_max_seconds * 1000000)::BIGINT AS itl_max_us,
           round(e2e_seconds * 1000000)::BIGINT AS e2e_us
    FROM (SELECT *, regexp_extract(request_id, '^(.*?)([1-9][0-9]{0,17})$', ['text', 'number']) AS id FROM _insert_batch)
)
