"""Kiln's flatbuffers schema of MegEngine ``.mge`` models and its code generator (``generate.py``)."""
