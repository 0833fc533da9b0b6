"""Op family: resize (to be filled)."""
