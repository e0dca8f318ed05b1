"""Media facts every kind shares: ffprobe, sources as probed and hashed files, the
validation gate (decode check, expectations), poster frames, sample media."""
