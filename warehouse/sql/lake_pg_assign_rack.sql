-- give a rack to a role, claimed or not (rack and role literals: PostgreSQL binds no parameter in a statement sent
-- whole, postgres_execute)
INSERT INTO moemeter.rack_owners (rack, owner) VALUES ({{'rack'}}, {{'role'}})
ON CONFLICT (rack) DO UPDATE SET owner = EXCLUDED.owner, claimed_at = now()
