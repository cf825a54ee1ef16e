-- a rack's watermarks in the lake (name, through)
SELECT name, through FROM lake.{{state}} WHERE rack = $rack
