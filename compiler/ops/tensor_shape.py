"""Op family: tensor_shape (to be filled)."""
