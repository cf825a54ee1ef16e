-- Every stored version of every SLO class (warehouse/slo.py, stored_slo_sheet).
SELECT class, effective, ttft_seconds, itl_seconds, e2e_seconds, objective, period_days, is_default, own_targets
FROM slo_classes ORDER BY class, effective
