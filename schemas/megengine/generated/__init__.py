"""flatc-generated readers of the MegEngine .mge schema; do not edit.

Regenerate with ``python -m schemas.megengine.generate`` (flatc 25.12.19); the
schema sources and the two codegen edits are described in schemas/megengine/generate.py.
"""
