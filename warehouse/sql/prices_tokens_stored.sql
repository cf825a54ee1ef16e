-- The token prices effective at $effective, if stored (in TOKEN_PRICES' order, warehouse/prices.py).
SELECT usd_per_mtok_input_cache_hit, usd_per_mtok_input_cache_miss, usd_per_mtok_output
FROM token_prices WHERE effective = $effective
