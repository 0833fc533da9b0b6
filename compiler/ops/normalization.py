"""Op family: normalization (to be filled)."""
