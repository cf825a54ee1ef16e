-- moemeter's guard on a DuckLake 1.0 catalog in PostgreSQL (warehouse/lake.py, install_guard): each rack's rows
-- are written by the role that owns the rack, checked here, whatever SQL a publisher sends. Sent as one script by
-- the lake's owner, under the install's advisory lock (GUARD_LOCK: two owners' publishers install it in turn).
-- The lock's number, the rule of a rack's name (RACK_NAME) and the schema's comment (GUARD_VERSION) are written as
-- literals (lake.py quotes them): PostgreSQL binds no parameter in a script sent whole (postgres_execute), nor in a
-- function's body or a COMMENT. The roles' and the trigger's names are identifiers of warehouse/sql IDENTIFIERS.
SELECT pg_advisory_xact_lock({{'lock'}}::bigint);
CREATE SCHEMA IF NOT EXISTS moemeter;
GRANT USAGE ON SCHEMA moemeter TO PUBLIC;
CREATE TABLE IF NOT EXISTS moemeter.rack_owners (
    rack varchar PRIMARY KEY,
    owner name NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON moemeter.rack_owners FROM PUBLIC;
GRANT SELECT ON moemeter.rack_owners TO PUBLIC;
CREATE INDEX IF NOT EXISTS moemeter_guard_snapshot_id ON public.ducklake_snapshot (snapshot_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_file_id ON public.ducklake_data_file (data_file_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_partition_file ON public.ducklake_file_partition_value (data_file_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_stats_file ON public.ducklake_file_column_stats (data_file_id);

-- the lake's owner: the role that owns DuckLake's tables (it made the lake), and its members
CREATE OR REPLACE FUNCTION moemeter.owner() RETURNS name
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = 'public.ducklake_metadata'::regclass
$$;

CREATE OR REPLACE FUNCTION moemeter.is_owner() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_has_role(session_user, moemeter.owner(), 'MEMBER')
$$;

CREATE OR REPLACE FUNCTION moemeter.refuse(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'lake guard: %', what USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE FUNCTION moemeter.owner_only(what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT moemeter.is_owner() THEN
        PERFORM moemeter.refuse(format('role %s may not %s: only the lake''s owner, role %s, may', session_user,
            what, moemeter.owner()));
    END IF;
END $$;

-- the rack's owner, claimed by the session's role when nobody owns it yet
CREATE OR REPLACE FUNCTION moemeter.claim_rack(r varchar) RETURNS name
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE o name;
BEGIN
    SELECT owner INTO o FROM moemeter.rack_owners WHERE rack = r;
    IF NOT FOUND THEN
        INSERT INTO moemeter.rack_owners (rack, owner) VALUES (r, session_user) ON CONFLICT (rack) DO NOTHING;
        SELECT owner INTO o FROM moemeter.rack_owners WHERE rack = r;
    END IF;
    RETURN o;
END $$;

-- refuses unless the session's role owns rack r (or is the lake's owner); `what` says what was tried
CREATE OR REPLACE FUNCTION moemeter.check_rack(r varchar, what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE o name;
BEGIN
    IF r IS NOT NULL THEN
        o := moemeter.claim_rack(r);
    END IF;
    IF moemeter.is_owner() THEN
        RETURN;
    END IF;
    IF r IS NULL THEN
        PERFORM moemeter.refuse(format('role %s may not %s rows that name no rack', session_user, what));
    END IF;
    IF r !~ {{'rack_name'}} THEN  -- the folder of its files is rack=<r>/: one name, no path
        PERFORM moemeter.refuse(format('role %s may not %s rows of rack %L: a rack is named by 1-64 letters, '
            'digits, ''.'', ''_'' or ''-'', starting with a letter or digit', session_user, what, r));
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = o) AND pg_has_role(session_user, o, 'MEMBER') THEN
        RETURN;
    END IF;
    PERFORM moemeter.refuse(format('rack %L belongs to role %s; role %s may not %s its rows', r, o,
        session_user, what));
END $$;

-- the rack an inlined row names (DuckLake 1.0 keeps a VARCHAR inline as bytea)
CREATE OR REPLACE FUNCTION moemeter.row_rack(j jsonb, kind text) RETURNS varchar
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE kind WHEN 'bytea' THEN convert_from(decode(substr(j->>'rack', 3), 'hex'), 'UTF8')
                     WHEN 'text' THEN j->>'rack' END
$$;

-- the racks a data file's partition names (one, for a file a rack wrote)
CREATE OR REPLACE FUNCTION moemeter.file_racks(fid bigint) RETURNS varchar[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(pv.partition_value), '{}')
    FROM public.ducklake_data_file f
    JOIN public.ducklake_partition_column pc
      ON pc.partition_id = f.partition_id AND pc.table_id = f.table_id AND pc.transform = 'identity'
    JOIN public.ducklake_file_partition_value pv
      ON pv.data_file_id = f.data_file_id AND pv.partition_key_index = pc.partition_key_index
    WHERE f.data_file_id = fid
      AND EXISTS (SELECT 1 FROM public.ducklake_column c
                  WHERE c.table_id = f.table_id AND c.column_id = pc.column_id AND c.column_name = 'rack')
$$;

CREATE OR REPLACE FUNCTION moemeter.file_rack(fid bigint) RETURNS varchar
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN cardinality(r) = 1 THEN r[1] END FROM (SELECT moemeter.file_racks(fid) AS r) x
$$;

-- a new data file: one rack in its partition, the writer's; its statistics say so; lake_state stays inline
CREATE OR REPLACE FUNCTION moemeter.check_file(fid bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    copies bigint; tid bigint; tname varchar; racks varchar[]; seen bigint; bad bigint; f record;
BEGIN
    SELECT count(*), min(table_id) INTO copies, tid FROM public.ducklake_data_file WHERE data_file_id = fid;
    IF copies = 0 OR moemeter.is_owner() THEN
        RETURN;  -- gone again in the same transaction (a merge's intermediate file), or the owner's
    END IF;
    SELECT table_name INTO tname FROM public.ducklake_table WHERE table_id = tid ORDER BY begin_snapshot DESC LIMIT 1;
    IF copies > 1 THEN
        PERFORM moemeter.refuse(format('data file id %s of table %s is used twice', fid, tname));
    END IF;
    IF tname = 'lake_state' THEN
        PERFORM moemeter.refuse(format('role %s may not write lake_state in a data file: a rack''s watermarks '
            'are a few rows, written inline where each is checked', session_user));
    END IF;
    racks := moemeter.file_racks(fid);
    IF cardinality(racks) <> 1 THEN
        PERFORM moemeter.refuse(format('role %s may not write a data file of table %s that names %s racks '
            'in its partition (one, its own)', session_user, tname, cardinality(racks)));
    END IF;
    PERFORM moemeter.check_rack(racks[1], 'write');
    SELECT count(*), count(*) FILTER (WHERE s.min_value IS DISTINCT FROM racks[1] OR s.max_value IS DISTINCT FROM racks[1]
                                        OR s.null_count IS DISTINCT FROM 0)
      INTO seen, bad
      FROM public.ducklake_file_column_stats s
     WHERE s.data_file_id = fid
       AND s.column_id IN (SELECT column_id FROM public.ducklake_column WHERE table_id = tid AND column_name = 'rack');
    IF seen = 0 OR bad > 0 THEN
        PERFORM moemeter.refuse(format('the statistics of a data file of table %s must say that its rack column '
            'holds %L alone', tname, racks[1]));
    END IF;
    SELECT path, path_is_relative INTO f FROM public.ducklake_data_file WHERE data_file_id = fid;
    PERFORM moemeter.check_path('data', tid, racks[1], f.path, f.path_is_relative, 1);
END $$;

-- a <= b, as values of the DuckLake type typ (statistics are kept as text)
CREATE OR REPLACE FUNCTION moemeter.stat_le(a varchar, b varchar, typ varchar) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF a = b THEN
        RETURN true;
    ELSIF typ ~ '^u?int(8|16|32|64|128)$' OR typ LIKE 'decimal%' THEN
        RETURN a::numeric <= b::numeric;
    ELSIF typ IN ('float32', 'float64') THEN
        RETURN a::float8 <= b::float8;
    ELSIF typ LIKE 'timestamptz%' THEN
        RETURN a::timestamptz <= b::timestamptz;
    ELSIF typ LIKE 'timestamp%' OR typ = 'date' THEN
        RETURN a::timestamp <= b::timestamp;
    ELSIF typ = 'boolean' THEN
        RETURN a::boolean <= b::boolean;
    ELSIF typ IN ('varchar', 'blob', 'uuid') THEN
        RETURN a COLLATE "C" <= b COLLATE "C";  -- DuckDB orders strings by their bytes
    END IF;
    RETURN false;  -- a type not ordered here: its statistics may only stay as they are
EXCEPTION WHEN others THEN
    RETURN false;
END $$;

-- ---------------------------------------------------------------------------------------- triggers
-- an inlined row (ducklake_inlined_data_*): written, and ended, by its rack's owner; removed by the lake's
CREATE OR REPLACE FUNCTION moemeter.guard_inlined() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF OLD.end_snapshot IS NOT NULL OR NEW.end_snapshot IS NULL
           OR (to_jsonb(NEW) - 'end_snapshot') IS DISTINCT FROM (to_jsonb(OLD) - 'end_snapshot') THEN
            PERFORM moemeter.owner_only(format('change rows of %s other than by ending them', TG_TABLE_NAME));
            RETURN NEW;
        END IF;
        PERFORM moemeter.check_rack(moemeter.row_rack(to_jsonb(OLD), TG_ARGV[0]), 'delete');
        RETURN NEW;
    END IF;
    PERFORM moemeter.check_rack(moemeter.row_rack(to_jsonb(NEW), TG_ARGV[0]), 'write');
    RETURN NEW;
END $$;

-- ducklake_data_file, ducklake_delete_file: a rack's owner may end or remove a file of its rack (DuckLake
-- removes a delete file that a larger one replaces); the rest is the lake's owner's
CREATE OR REPLACE FUNCTION moemeter.guard_file_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RETURN NEW;  -- checked at commit, with its partition and statistics
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM moemeter.check_rack(moemeter.file_rack(OLD.data_file_id), 'remove');
        RETURN OLD;
    END IF;
    IF OLD.end_snapshot IS NOT NULL OR NEW.end_snapshot IS NULL
       OR (to_jsonb(NEW) - 'end_snapshot') IS DISTINCT FROM (to_jsonb(OLD) - 'end_snapshot') THEN
        PERFORM moemeter.owner_only(format('change rows of %s other than by ending a live file', TG_TABLE_NAME));
        RETURN NEW;
    END IF;
    PERFORM moemeter.check_rack(moemeter.file_rack(OLD.data_file_id), 'delete');
    RETURN NEW;
END $$;

-- what is said of a data file (partition, statistics) and inlined deletions: added (checked at commit),
-- and removed with the file or by its rack's owner
CREATE OR REPLACE FUNCTION moemeter.guard_file_facts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE fid bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM moemeter.owner_only(format('change rows of %s', TG_TABLE_NAME));
        RETURN NEW;
    END IF;
    fid := coalesce(to_jsonb(OLD)->>'data_file_id', to_jsonb(OLD)->>'file_id')::bigint;
    IF EXISTS (SELECT 1 FROM public.ducklake_data_file WHERE data_file_id = fid) THEN
        PERFORM moemeter.check_rack(moemeter.file_rack(fid), 'remove');
    END IF;
    RETURN OLD;
END $$;

-- a file scheduled for deletion: the lake's owner's cleanup deletes it from the data path. A rack's
-- writer may schedule a file no longer in the catalog (one its commit removed), under the data path
CREATE OR REPLACE FUNCTION moemeter.file_name(path varchar) RETURNS varchar
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT substring(path from '[^/]*$')
$$;
CREATE INDEX IF NOT EXISTS moemeter_guard_data_file_name ON public.ducklake_data_file (moemeter.file_name(path));
CREATE INDEX IF NOT EXISTS moemeter_guard_delete_file_name ON public.ducklake_delete_file (moemeter.file_name(path));

-- a file a rack's writer adds: relative, in rack=<r>/ under its table's folder (a delete file also in the table's
-- folder itself, where DuckLake writes them), named as no other data or delete file of the catalog (`own`: the
-- rows that are this file, 1 or 0 once removed again). The owner's cleanup deletes the path of each file ended
-- and expired: a file at the path of another rack's, ended by its writer, would delete that one
CREATE OR REPLACE FUNCTION moemeter.check_path(kind text, tid bigint, r varchar, fpath varchar, frelative boolean,
                                               own bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    folder varchar := 'rack=' || r || '/';
    fname varchar := CASE WHEN starts_with(fpath, folder) THEN substr(fpath, length(folder) + 1)
                          WHEN kind = 'delete' THEN fpath END;
    tname varchar;
BEGIN
    SELECT table_name INTO tname FROM public.ducklake_table WHERE table_id = tid ORDER BY begin_snapshot DESC LIMIT 1;
    IF frelative IS NOT TRUE OR fname IS NULL OR fname !~ '^[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$' THEN
        PERFORM moemeter.refuse(format('role %s may not add a %s file of table %s at %s%L: a file of rack %L is a '
            'Parquet file in %s', session_user, kind, tname, CASE WHEN frelative THEN '' ELSE 'the absolute path ' END,
            fpath, r, CASE kind WHEN 'delete' THEN format('its table''s folder or in %s under it', folder)
                                ELSE format('%s under its table''s folder', folder) END));
    END IF;
    IF (SELECT count(*) FROM public.ducklake_data_file WHERE moemeter.file_name(path) = fname)
       + (SELECT count(*) FROM public.ducklake_delete_file WHERE moemeter.file_name(path) = fname) > own THEN
        PERFORM moemeter.refuse(format('role %s may not add a %s file of table %s at %L: the catalog names a file %L '
            'already, which the lake''s cleanup would delete with it', session_user, kind, tname, fpath, fname));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION moemeter.guard_scheduled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
/*lake_pg_owner_only*/
    IF NOT moemeter.is_owner() AND (NOT NEW.path_is_relative OR NEW.path LIKE '/%' OR NEW.path ~ '(^|/)\.\.(/|$)') THEN
        PERFORM moemeter.refuse(format('role %s may not schedule %s for deletion: a path outside the data path',
            session_user, NEW.path));
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION moemeter.commit_scheduled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT moemeter.is_owner()
       AND (EXISTS (SELECT 1 FROM public.ducklake_data_file WHERE moemeter.file_name(path) = moemeter.file_name(NEW.path))
            OR EXISTS (SELECT 1 FROM public.ducklake_delete_file
                       WHERE moemeter.file_name(path) = moemeter.file_name(NEW.path))) THEN
        PERFORM moemeter.refuse(format('role %s may not schedule %s for deletion: the catalog still names it',
            session_user, NEW.path));
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION moemeter.commit_file() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM moemeter.check_file(NEW.data_file_id);
    RETURN NULL;
END $$;

-- a delete file or inlined deletion: of rows of the writer's rack; a delete file where check_path says
CREATE OR REPLACE FUNCTION moemeter.commit_deletes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rec jsonb := to_jsonb(NEW);
    fid bigint := coalesce(rec->>'data_file_id', rec->>'file_id')::bigint;
    r varchar := moemeter.file_rack(fid);
BEGIN
    PERFORM moemeter.check_rack(r, 'delete');
    IF TG_TABLE_NAME = 'ducklake_delete_file' AND NOT moemeter.is_owner() THEN
        PERFORM moemeter.check_path('delete', (rec->>'table_id')::bigint, r, rec->>'path',
            (rec->>'path_is_relative')::boolean,
            (SELECT count(*) FROM public.ducklake_delete_file WHERE delete_file_id = (rec->>'delete_file_id')::bigint));
    END IF;
    RETURN NULL;
END $$;

-- a snapshot follows the last one, with the same schema; history is changed by the lake's owner
CREATE OR REPLACE FUNCTION moemeter.guard_snapshot() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE last record;
BEGIN
/*lake_pg_owner_only*/
    IF moemeter.is_owner() THEN
        RETURN NEW;
    END IF;
    SELECT * INTO last FROM public.ducklake_snapshot ORDER BY snapshot_id DESC LIMIT 1;
    IF NEW.snapshot_id <= last.snapshot_id OR NEW.schema_version IS DISTINCT FROM last.schema_version
       OR NEW.next_catalog_id IS DISTINCT FROM last.next_catalog_id OR NEW.next_file_id < last.next_file_id THEN
        PERFORM moemeter.refuse(format('role %s may not add snapshot %s after snapshot %s: a rack''s commit '
            'follows the last one and changes no schema', session_user, NEW.snapshot_id, last.snapshot_id));
    END IF;
    RETURN NEW;
END $$;

-- at commit: every table of the catalog is the owner's (a table a publisher made would be unguarded)
CREATE OR REPLACE FUNCTION moemeter.commit_catalog() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t record;
BEGIN
    IF moemeter.is_owner() THEN
        RETURN NULL;
    END IF;
    SELECT c.relname, pg_get_userbyid(c.relowner) AS owner INTO t
      FROM pg_class c
     WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
       AND c.relname LIKE 'ducklake%'
       AND pg_get_userbyid(c.relowner) <> moemeter.owner()
     LIMIT 1;
    IF FOUND THEN
        PERFORM moemeter.refuse(format('table %s of the catalog belongs to role %s, not to the lake''s owner: '
            'nothing commits until it is dropped', t.relname, t.owner));
    END IF;
    RETURN NULL;
END $$;

-- who committed: the session's role, whatever the writer says
CREATE OR REPLACE FUNCTION moemeter.guard_author() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
/*lake_pg_owner_only*/
    NEW.author := session_user;
    RETURN NEW;
END $$;

-- a table's counts: row ids never go back (a reused id would end another rack's rows with the writer's)
CREATE OR REPLACE FUNCTION moemeter.guard_table_stats() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    ELSIF moemeter.is_owner() THEN
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM public.ducklake_table_stats WHERE table_id = NEW.table_id) THEN
            PERFORM moemeter.refuse(format('table %s has its counts already', NEW.table_id));
        END IF;
    ELSIF NEW.table_id <> OLD.table_id OR NEW.next_row_id < OLD.next_row_id THEN
        PERFORM moemeter.refuse(format('role %s may not move table %s''s next row id back', session_user,
            OLD.table_id));
    END IF;
    RETURN NEW;
END $$;

-- a table's column statistics only widen (narrowed, a reader would skip rows that are there)
CREATE OR REPLACE FUNCTION moemeter.guard_column_stats() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE typ varchar;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    ELSIF moemeter.is_owner() THEN
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM public.ducklake_table_column_stats
                   WHERE table_id = NEW.table_id AND column_id = NEW.column_id) THEN
            PERFORM moemeter.refuse(format('column %s of table %s has its statistics already', NEW.column_id,
                NEW.table_id));
        END IF;
    ELSE
        SELECT column_type INTO typ FROM public.ducklake_column
         WHERE table_id = OLD.table_id AND column_id = OLD.column_id ORDER BY begin_snapshot DESC LIMIT 1;
        IF NEW.table_id <> OLD.table_id OR NEW.column_id <> OLD.column_id
           OR (OLD.contains_null AND NOT coalesce(NEW.contains_null, false))
           OR (OLD.contains_nan AND NOT coalesce(NEW.contains_nan, false))
           OR (OLD.min_value IS NOT NULL AND (NEW.min_value IS NULL
                                              OR NOT moemeter.stat_le(NEW.min_value, OLD.min_value, typ)))
           OR (OLD.max_value IS NOT NULL AND (NEW.max_value IS NULL
                                              OR NOT moemeter.stat_le(OLD.max_value, NEW.max_value, typ))) THEN
            PERFORM moemeter.refuse(format('role %s may not narrow the statistics of column %s of table %s',
                session_user, OLD.column_id, OLD.table_id));
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- the catalog's structure (schemas, tables, columns, partitions, options): the lake's owner's
CREATE OR REPLACE FUNCTION moemeter.guard_structure() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM moemeter.owner_only(format('write %s', TG_TABLE_NAME));
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

-- the owner's: guards (and grants) every table of the catalog not guarded yet, and makes the inlined
-- deletion table of each lake table before a publisher would (DuckLake makes it on the first one)
CREATE OR REPLACE FUNCTION moemeter.guard_tables() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record; kind text; fn text; rack_type text; guarded integer := 0;
    publishers boolean := EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {{'publishers'}});
    readers boolean := EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {{'readers'}});
BEGIN
    FOR t IN SELECT DISTINCT table_id FROM public.ducklake_table WHERE end_snapshot IS NULL LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS public.%I (file_id BIGINT, row_id BIGINT, begin_snapshot BIGINT)',
                       'ducklake_inlined_delete_' || t.table_id);
    END LOOP;
    FOR t IN SELECT c.oid, c.relname FROM pg_class c
              WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'ducklake%'
              ORDER BY c.relname LOOP
        kind := CASE
            WHEN t.relname ~ '^ducklake_inlined_data_[0-9]+_[0-9]+$' THEN 'inlined'
            WHEN t.relname ~ '^ducklake_inlined_delete_[0-9]+$' THEN 'facts'
            WHEN t.relname IN ('ducklake_data_file', 'ducklake_delete_file') THEN 'file_rows'
            WHEN t.relname IN ('ducklake_file_partition_value', 'ducklake_file_column_stats',
                               'ducklake_file_variant_stats') THEN 'facts'
            WHEN t.relname = 'ducklake_snapshot' THEN 'snapshot'
            WHEN t.relname = 'ducklake_snapshot_changes' THEN 'author'
            WHEN t.relname = 'ducklake_table_stats' THEN 'table_stats'
            WHEN t.relname = 'ducklake_table_column_stats' THEN 'column_stats'
            WHEN t.relname IN ('ducklake_metadata', 'ducklake_schema', 'ducklake_table', 'ducklake_view',
                               'ducklake_column', 'ducklake_column_tag', 'ducklake_tag', 'ducklake_partition_info',
                               'ducklake_partition_column', 'ducklake_macro', 'ducklake_macro_impl',
                               'ducklake_macro_parameters', 'ducklake_sort_info', 'ducklake_sort_expression',
                               'ducklake_column_mapping', 'ducklake_name_mapping', 'ducklake_inlined_data_tables',
                               'ducklake_schema_versions') THEN 'structure'
            WHEN t.relname = 'ducklake_files_scheduled_for_deletion' THEN 'scheduled'
            ELSE NULL END;  -- a table of a later DuckLake: read-only to publishers until the guard knows it
        IF kind IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND tgname = {{'trigger'}}) THEN
            IF kind = 'inlined' THEN
                SELECT CASE format_type(a.atttypid, a.atttypmod) WHEN 'bytea' THEN 'bytea' ELSE 'text' END
                  INTO rack_type FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attname = 'rack' AND NOT a.attisdropped;
                EXECUTE format('CREATE TRIGGER {{trigger}} BEFORE INSERT OR UPDATE OR DELETE ON public.%I FOR EACH ROW '
                               'EXECUTE FUNCTION moemeter.guard_inlined(%L)', t.relname, coalesce(rack_type, 'none'));
            ELSE
                fn := CASE kind WHEN 'file_rows' THEN 'guard_file_rows' WHEN 'facts' THEN 'guard_file_facts'
                                WHEN 'snapshot' THEN 'guard_snapshot' WHEN 'author' THEN 'guard_author'
                                WHEN 'table_stats' THEN 'guard_table_stats'
                                WHEN 'column_stats' THEN 'guard_column_stats' WHEN 'scheduled' THEN 'guard_scheduled'
                                ELSE 'guard_structure' END;
                EXECUTE format('CREATE TRIGGER {{trigger}} BEFORE INSERT OR UPDATE OR DELETE ON public.%I '
                               'FOR EACH ROW EXECUTE FUNCTION moemeter.%I()', t.relname, fn);
            END IF;
            fn := CASE WHEN t.relname IN ('ducklake_data_file', 'ducklake_file_partition_value', 'ducklake_file_column_stats',
                                          'ducklake_file_variant_stats') THEN 'commit_file'
                       WHEN t.relname = 'ducklake_delete_file' OR t.relname ~ '^ducklake_inlined_delete_[0-9]+$'
                           THEN 'commit_deletes'
                       WHEN t.relname = 'ducklake_snapshot' THEN 'commit_catalog'
                       WHEN t.relname = 'ducklake_files_scheduled_for_deletion' THEN 'commit_scheduled' END;
            IF fn IS NOT NULL THEN
                EXECUTE format('CREATE CONSTRAINT TRIGGER moemeter_guard_commit AFTER INSERT ON public.%I '
                               'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION moemeter.%I()', t.relname, fn);
            END IF;
            guarded := guarded + 1;
        END IF;
        IF publishers THEN
            IF kind IS NULL THEN
                EXECUTE format('GRANT SELECT ON public.%I TO {{publishers}}', t.relname);
            ELSIF NOT has_table_privilege({{'publishers'}}, t.oid, 'INSERT') THEN
                EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO {{publishers}}', t.relname);
            END IF;
        END IF;
        IF readers AND NOT has_table_privilege({{'readers'}}, t.oid, 'SELECT') THEN
            EXECUTE format('GRANT SELECT ON public.%I TO {{readers}}', t.relname);
        END IF;
    END LOOP;
    IF publishers THEN  -- DuckLake says CREATE TABLE IF NOT EXISTS for inlined deletions: PostgreSQL asks CREATE
        GRANT USAGE, CREATE ON SCHEMA public TO {{publishers}};
        GRANT EXECUTE ON FUNCTION moemeter.check_rack(varchar, text) TO {{publishers}};  -- a publisher's first check
    END IF;
    IF readers THEN
        GRANT USAGE ON SCHEMA public TO {{readers}};
    END IF;
    RETURN guarded;
END $$;
-- a function of the guard is called by its triggers (as the owner) and by no one else: the claim of a rack too
-- (check_rack, claim_rack) is granted to the publishers alone (guard_tables). An index on DuckLake's file tables
-- computes file_name as the writer of a row.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA moemeter FROM PUBLIC;
GRANT EXECUTE ON FUNCTION moemeter.file_name(varchar) TO PUBLIC;
COMMENT ON SCHEMA moemeter IS {{'comment'}};
