"""Kiln's CANN (.om) protobuf schemas and the script that regenerates their Python code."""
