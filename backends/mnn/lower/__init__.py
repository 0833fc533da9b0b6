"""Lowering Kiln ops to MNN ops: one module per op family, merged in :mod:`.table`."""
