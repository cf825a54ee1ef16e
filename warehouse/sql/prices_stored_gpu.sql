-- Every stored GPU-hour price (warehouse/prices.py, stored_sheet).
SELECT effective, pool, usd_per_gpu_hour, source FROM gpu_prices ORDER BY effective
