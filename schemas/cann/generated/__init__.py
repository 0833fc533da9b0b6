"""Generated protobuf code for Kiln's CANN schemas (schemas/cann/*.proto).

Do not edit: regenerate with ``python -m schemas.cann.generate``.
"""
