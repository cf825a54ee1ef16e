-- Targets that export per-rank expert load or expert snapshots.
SELECT DISTINCT target FROM series WHERE metric = 'moemeter_expert_rank_tokens_total'
UNION SELECT DISTINCT target FROM expert_snapshots ORDER BY 1
