-- Every stored SLO class assignment (warehouse/slo.py, stored_slo_sheet).
SELECT effective, kind, name, class, tenant FROM slo_assignments ORDER BY kind, tenant, name, effective
