-- Tokens per logical expert of $target in the window: per-snapshot load, or its hourly
-- downsampling for windows stepped in hours (/*expert_load*/, warehouse/read.py).
SELECT layer, expert, sum(tokens) AS tokens FROM /*expert_load*/
WHERE ts >= $since::TIMESTAMP AND ts < $end::TIMESTAMP AND target = $target
GROUP BY ALL ORDER BY layer, expert
