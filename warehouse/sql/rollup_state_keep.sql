-- Records that retention dropped a counter table's rows before $through (rollup_state $name:
-- increments_from, increments_1m_from); the mark only moves forward.
INSERT INTO rollup_state VALUES ($name, $through)
ON CONFLICT (name) DO UPDATE SET through = greatest(through, excluded.through)
