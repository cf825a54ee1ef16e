-- Every stored version of the token prices (warehouse/prices.py, stored_sheet).
SELECT effective, usd_per_mtok_input_cache_hit, usd_per_mtok_input_cache_miss, usd_per_mtok_output, off_peak_utc,
       off_peak_usd_per_mtok_input_cache_hit, off_peak_usd_per_mtok_input_cache_miss, off_peak_usd_per_mtok_output,
       source
FROM token_prices ORDER BY effective
