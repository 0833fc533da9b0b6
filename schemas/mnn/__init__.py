"""Kiln's MNN flatbuffers schema (``*.fbs``) and the script that regenerates its Python code."""
