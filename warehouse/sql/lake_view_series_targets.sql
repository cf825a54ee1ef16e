-- the series with their targets' role, GPUs and host, over a rack's views
CREATE OR REPLACE VIEW series_targets AS
SELECT s.*, t.role, t.gpus, t.hostname FROM series s JOIN targets t ON s.target = t.name
