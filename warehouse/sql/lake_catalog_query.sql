-- the rows of a query on the lake's PostgreSQL catalog, attached plainly (LOCK_DB)
SELECT * FROM postgres_query($database, $statement)
