-- a lake table's files hold one rack each
ALTER TABLE lake.{{table}} SET PARTITIONED BY (rack)
