-- (a condition of lake statements) the rows of a published table in [$since, $end), NULL: unbounded on that side
($since IS NULL OR ts >= $since) AND ($end IS NULL OR ts < $end)
