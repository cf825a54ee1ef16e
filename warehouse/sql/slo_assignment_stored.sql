-- The class a user or key ($kind $name of $tenant) is assigned from $effective, if stored.
SELECT class FROM slo_assignments WHERE kind = $kind AND tenant = $tenant AND name = $name AND effective = $effective
