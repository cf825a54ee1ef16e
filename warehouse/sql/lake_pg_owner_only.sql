-- (in the guard's triggers, lake_pg_guard) a row changed or removed: by the lake's owner alone
    IF TG_OP <> 'INSERT' THEN
        PERFORM moemeter.owner_only(format('change or remove rows of %s', TG_TABLE_NAME));
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
