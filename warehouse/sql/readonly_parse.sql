-- DuckDB's own parse tree of a reader's statement $sql, as JSON (an "error" key where it does not
-- parse), which warehouse/readonly.py walks whole.
SELECT json_serialize_sql($sql::VARCHAR)
