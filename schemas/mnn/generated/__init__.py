"""Generated flatbuffers code for Kiln's MNN schema (schemas/mnn/*.fbs).

Do not edit: regenerate with ``python -m schemas.mnn.generate``.
"""
