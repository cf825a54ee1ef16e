-- Stores a version of SLO class $slo_class from the sheet $sheet.
INSERT INTO slo_classes (effective, class, ttft_seconds, itl_seconds, e2e_seconds, objective, period_days, is_default,
                         own_targets, sheet, source, loaded_at)
VALUES ($effective, $slo_class, $ttft_seconds, $itl_seconds, $e2e_seconds, $objective, $period_days, $is_default,
        $own_targets, $sheet, $source, $loaded_at)
