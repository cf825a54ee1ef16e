-- the earliest minute the raw increments closed from $start add to (an increment covers `seconds` before its ts)
SELECT min(ts - to_microseconds(round(seconds * 1e6)::BIGINT)) FROM increments WHERE ts >= $start
