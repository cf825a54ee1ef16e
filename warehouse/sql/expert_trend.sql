-- Each expert's share of its layer's tokens at each snapshot of $target (each hour for windows
-- stepped in hours); only for the layers in $layers and the experts in $keys (layer * 2^20 +
-- expert) when they are given, so a day of snapshots is not read back for ten sparklines.
WITH total AS (
    SELECT ts, layer, sum(tokens) AS tokens FROM /*expert_load*/
    WHERE ts >= $since::TIMESTAMP AND ts < $end::TIMESTAMP AND target = $target
      AND ($layers::BIGINT[] IS NULL OR list_contains($layers::BIGINT[], layer::BIGINT))
    GROUP BY ALL
)
SELECT e.ts, e.layer, e.expert, e.tokens / nullif(t.tokens, 0) AS share
FROM /*expert_load*/ e JOIN total t USING (ts, layer)
WHERE e.ts >= $since::TIMESTAMP AND e.ts < $end::TIMESTAMP AND e.target = $target
  AND ($keys::BIGINT[] IS NULL OR list_contains($keys::BIGINT[], e.layer::BIGINT * 1048576 + e.expert))
