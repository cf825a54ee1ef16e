-- Records that the roll-up named $name has rolled everything before $through.
INSERT INTO rollup_state VALUES ($name, $through) ON CONFLICT (name) DO UPDATE SET through = excluded.through
