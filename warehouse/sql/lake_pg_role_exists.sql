-- whether a PostgreSQL role of this name exists (the name a literal: PostgreSQL binds no parameter in a query
-- sent whole, postgres_query)
SELECT 1 FROM pg_roles WHERE rolname = {{'role'}}
