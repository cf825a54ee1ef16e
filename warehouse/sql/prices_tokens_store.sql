-- Stores the token prices from $effective (and their off-peak prices, NULL where the sheet has no
-- off-peak hours), from the sheet $sheet.
INSERT INTO token_prices (effective, usd_per_mtok_input_cache_hit, usd_per_mtok_input_cache_miss, usd_per_mtok_output,
                          off_peak_utc, off_peak_usd_per_mtok_input_cache_hit, off_peak_usd_per_mtok_input_cache_miss,
                          off_peak_usd_per_mtok_output, sheet, source, loaded_at)
VALUES ($effective, $usd_per_mtok_input_cache_hit, $usd_per_mtok_input_cache_miss, $usd_per_mtok_output,
        $off_peak_utc, $off_peak_usd_per_mtok_input_cache_hit, $off_peak_usd_per_mtok_input_cache_miss,
        $off_peak_usd_per_mtok_output, $sheet, $source, $loaded_at)
