-- The stack each stored target was last seen on: a name another stack now uses would mix two
-- histories (collectors/service.py warns).
SELECT name, stack FROM targets
