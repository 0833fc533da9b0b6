"""Op family: tensor_data (to be filled)."""
