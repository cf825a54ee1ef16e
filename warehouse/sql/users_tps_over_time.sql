-- Users: per step, exact quantiles of mean inter-token latency of the requests that finished in it.
SELECT make_timestamp(epoch_us(finished_at) // $step_us * $step_us) bucket,
       quantile_cont(itl_mean_seconds, 0.5) i50, quantile_cont(itl_mean_seconds, 0.9) i90, count(*) requests
FROM requests WHERE finished_at >= $start::TIMESTAMP AND finished_at < $end::TIMESTAMP AND itl_mean_seconds > 0
GROUP BY ALL ORDER BY bucket
