-- the racks that have published, by name
SELECT DISTINCT rack FROM lake.{{state}} ORDER BY rack
