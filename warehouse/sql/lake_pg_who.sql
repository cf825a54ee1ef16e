-- who a writer's session is to the guard: its role, the lake's owner, the guard's version, whether the role is the
-- owner (or a member of it), whether the group role of the publishers exists (a literal: PostgreSQL binds no
-- parameter in a query sent whole, postgres_query)
SELECT session_user::text AS role, coalesce(pg_get_userbyid(d.relowner)::text, '') AS owner,
       coalesce(substring(obj_description(s.oid, 'pg_namespace') from 'moemeter lake guard ([0-9]+)')::int, 0)
           AS version,
       coalesce(pg_has_role(session_user, d.relowner, 'MEMBER'), false) AS is_owner,
       EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {{'publishers'}}) AS publishers
FROM (SELECT 1) one
LEFT JOIN pg_class d ON d.oid = to_regclass('public.ducklake_metadata')
LEFT JOIN pg_namespace s ON s.nspname = 'moemeter'
