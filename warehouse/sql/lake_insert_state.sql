-- one of a rack's watermarks
INSERT INTO lake.{{state}} VALUES ($rack, $name, $through, now()::TIMESTAMP)
