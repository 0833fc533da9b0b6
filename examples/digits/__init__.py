"""The bundled example: a small CNN trained on scikit-learn's 8x8 digits (see ``train.py``)."""
