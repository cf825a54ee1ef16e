-- Issue #46. A user is identified within its tenant: the gateway's `user` field names a user of the
-- API key's tenant, so globex's requests with "user": "acme" are globex's user acme, never acme's.
-- The records and the hourly sums (requests_1h, requests_slo_1h) were keyed by tenant already and
-- keep every row; readers now group by tenant and user. An SLO assignment of a user names the
-- user's tenant as well, and the rules of judging change from the newest stored request on.
--
-- The rules' new version (slo_rules, version 2): a request's own targets only tighten its class's
-- unless the class says own_targets, and a request the client abandoned after it had missed a target
-- is held and missed (docs/definitions.md, "SLOs"). It judges the requests that finish after the
-- newest one stored now; those stored keep the rules they were rolled up by (own targets in place of
-- the class's, abandoned requests not held), so the records and what was rolled up always agree.
CREATE TABLE IF NOT EXISTS slo_rules (
    version  INTEGER PRIMARY KEY,
    since    TIMESTAMP NOT NULL  -- the version judges the requests that finished after this
);
INSERT INTO slo_rules
SELECT 2, coalesce((SELECT max(finished_at) FROM requests), '-infinity'::TIMESTAMP)
ON CONFLICT (version) DO NOTHING;

-- A class that lets a request's own targets (x-slo-ttft-ms, x-slo-tpot-ms) loosen its own.
ALTER TABLE slo_classes ADD COLUMN own_targets BOOLEAN DEFAULT false;

-- A user's assignment stored before named the user alone and held every tenant's user of that name.
-- It keeps every stored request's class: one in effect by then is re-keyed to each tenant with a user
-- of that name in the records or the hourly sums. From the new rules on it holds what the same entry
-- of a sheet names now, the user of that name in the tenant "anonymous" (the requests without a
-- key; warehouse/slo.py): the other tenants' users of that name get an entry of no class (their
-- tenant's or the default class holds them), and a tenant first seen from now on is not reached.
CREATE TEMP TABLE assignments_before AS SELECT * FROM slo_assignments;
DROP TABLE slo_assignments;
CREATE TABLE slo_assignments (
    effective  TIMESTAMP NOT NULL,
    kind       VARCHAR NOT NULL,  -- user | tenant (a user's own assignment wins)
    tenant     VARCHAR NOT NULL,  -- the user's tenant; a tenant's assignment: the tenant
    name       VARCHAR NOT NULL,  -- the user (within the tenant); a tenant's assignment: the tenant
    class      VARCHAR,           -- NULL: no class of its own from then (its tenant's or the default)
    sheet      VARCHAR NOT NULL,
    loaded_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (kind, tenant, name, effective)
);
INSERT INTO slo_assignments
SELECT effective, kind, name, name, class, sheet, loaded_at FROM assignments_before WHERE kind = 'tenant';
CREATE TEMP TABLE users_seen AS
SELECT a.effective, a.name, u.tenant, a.class, a.sheet, a.loaded_at
FROM assignments_before a
JOIN (SELECT user_id, tenant FROM requests UNION SELECT user_id, tenant FROM requests_1h) u ON u.user_id = a.name
WHERE a.kind = 'user' AND u.tenant <> 'anonymous' AND a.effective <= (SELECT since FROM slo_rules WHERE version = 2);
INSERT INTO slo_assignments
SELECT effective, 'user', tenant, name, class, sheet, loaded_at FROM users_seen
UNION ALL
SELECT effective, 'user', 'anonymous', name, class, sheet, loaded_at FROM assignments_before WHERE kind = 'user'
UNION ALL
SELECT DISTINCT (SELECT since FROM slo_rules WHERE version = 2) + INTERVAL 1 MICROSECOND, 'user', tenant, name, NULL,
       'migration 020', (current_timestamp AT TIME ZONE 'UTC')::TIMESTAMP
FROM users_seen;
DROP TABLE users_seen;
DROP TABLE assignments_before;
