-- The SLO rules' version 3 (slo_rules): a non-streamed request's time to first token is its
-- end-to-end time, its first token reaching the client with the whole answer (docs/definitions.md,
-- "SLOs"). Version 2 held a non-streamed request to a TTFT target only when its client hung up
-- (no token after waiting past it): one abandoned at 3 s missed a 1 s target while one answered
-- after 60 s met it. Version 3 judges the requests that finish after the newest one stored now (and
-- after version 2's start); those stored keep the verdicts they were rolled up with, so the records
-- and the hourly sums agree.
INSERT INTO slo_rules
SELECT 3, greatest(coalesce((SELECT max(finished_at) FROM requests), '-infinity'::TIMESTAMP),
                   (SELECT since FROM slo_rules WHERE version = 2))
ON CONFLICT (version) DO NOTHING;
