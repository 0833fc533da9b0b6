"""Op family: pooling (to be filled)."""
