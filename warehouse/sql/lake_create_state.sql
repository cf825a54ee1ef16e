-- each rack's watermarks in the lake
CREATE TABLE lake.{{state}} (rack VARCHAR, name VARCHAR, through TIMESTAMP, published_at TIMESTAMP)
