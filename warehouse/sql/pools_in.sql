-- The prefill and decode targets seen in [$start, $end) and the GPUs each holds (as the targets
-- file gave them).
SELECT name, role, gpus FROM targets
WHERE role IN {{pools}} AND first_seen < $end::TIMESTAMP AND last_seen >= $start::TIMESTAMP
ORDER BY name
