-- give a rack nobody owns to the session's role (the rack a literal: PostgreSQL binds no parameter in a
-- statement sent whole, postgres_execute)
SELECT moemeter.claim_rack({{'rack'}})
