-- the series a rack has published
SELECT series_id FROM lake.{{series}} WHERE rack = $rack
