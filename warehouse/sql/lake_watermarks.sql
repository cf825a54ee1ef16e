-- each rack's minute watermark
SELECT rack, through FROM lake.{{state}} WHERE name = '1m' ORDER BY rack
