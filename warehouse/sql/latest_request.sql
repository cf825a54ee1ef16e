-- The time the latest stored request finished.
SELECT max(finished_at) ts FROM requests
