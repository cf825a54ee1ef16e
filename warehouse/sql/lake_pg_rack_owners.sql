-- each rack the guard knows: its owner role and when it was claimed, by rack
SELECT rack::text, owner::text, claimed_at AT TIME ZONE 'UTC' FROM moemeter.rack_owners ORDER BY rack
