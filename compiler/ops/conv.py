"""Op family: conv (to be filled)."""
