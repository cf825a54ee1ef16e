-- The targets of SLO class $slo_class effective at $effective, if stored (in _CLASS_COLUMNS' order,
-- warehouse/slo.py).
SELECT ttft_seconds, itl_seconds, e2e_seconds, objective, period_days, is_default, own_targets
FROM slo_classes WHERE class = $slo_class AND effective = $effective
