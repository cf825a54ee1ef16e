-- How many SLO class versions are stored (none: the default sheet is stored first).
SELECT count(*) AS classes FROM slo_classes
