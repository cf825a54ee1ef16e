-- The GPU-hour price of pool $pool effective at $effective, if stored.
SELECT usd_per_gpu_hour FROM gpu_prices WHERE pool = $pool AND effective = $effective
