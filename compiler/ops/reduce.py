"""Op family: reduce (to be filled)."""
