-- The newest request the warehouse holds (a record's finish, or the end of the last hour rolled up):
-- an SLO sheet entry effective at or before it would change attainment already reported.
SELECT greatest((SELECT max(finished_at) FROM requests),
                (SELECT max(ts) + INTERVAL 1 HOUR FROM requests_slo_1h)) AS newest
