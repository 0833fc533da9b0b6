"""Op family: quantize (to be filled)."""
