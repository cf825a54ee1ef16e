-- Stores the assignment of a user or key ($kind $name of $tenant) to SLO class $slo_class from
-- $effective, from the sheet $sheet.
INSERT INTO slo_assignments (effective, kind, tenant, name, class, sheet, loaded_at)
VALUES ($effective, $kind, $tenant, $name, $slo_class, $sheet, $loaded_at)
