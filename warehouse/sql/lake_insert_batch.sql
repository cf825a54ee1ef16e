-- append a batch of a rack's rows (the Arrow table registered as _publish_batch) to a lake table
INSERT INTO lake.{{table}} BY NAME SELECT $rack AS rack, * FROM _publish_batch
