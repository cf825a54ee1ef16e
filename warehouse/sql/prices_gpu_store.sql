-- Stores a GPU-hour price of pool $pool from $effective, from the sheet $sheet.
INSERT INTO gpu_prices (effective, pool, usd_per_gpu_hour, sheet, source, loaded_at)
VALUES ($effective, $pool, $usd_per_gpu_hour, $sheet, $source, $loaded_at)
