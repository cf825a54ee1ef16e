-- Locks a database instance's configuration: no SQL can change a setting afterwards (the lock-down,
-- the memory limit).
SET lock_configuration = true
