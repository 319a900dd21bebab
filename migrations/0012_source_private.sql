-- How many entries a source's last list named on private, loopback or the
-- daemon's own addresses: dropped at harvest, counted here so that a list
-- planting them shows in /sources.
ALTER TABLE sources ADD COLUMN last_private INTEGER;
