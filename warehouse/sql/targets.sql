-- Every target ever stored.
SELECT name, url, role, gpus, stack, hostname, last_seen FROM targets ORDER BY role, name
