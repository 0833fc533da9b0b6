"""Op family: logic (to be filled)."""
