"""Op family: linalg (to be filled)."""
