-- A request's own targets, from the gateway's x-slo-ttft-ms and x-slo-tpot-ms headers; NULL when it
-- set none (its class's targets apply) and for records of gateways before them.
ALTER TABLE requests ADD COLUMN IF NOT EXISTS slo_ttft_seconds DOUBLE;
ALTER TABLE requests ADD COLUMN IF NOT EXISTS slo_itl_seconds DOUBLE;
