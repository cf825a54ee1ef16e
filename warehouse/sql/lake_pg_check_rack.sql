-- refuses unless the session's role may write the rack, claiming it when nobody owns it (the rack a literal:
-- PostgreSQL binds no parameter in a statement sent whole, postgres_execute)
SELECT moemeter.check_rack({{'rack'}}, 'write')
