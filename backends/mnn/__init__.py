"""The MNN backend: writes Kiln graphs as ``.mnn`` files for Alibaba's MNN runtime.

Modules, one concern each:

* ``options``     -- :class:`MnnOptions` (weight storage, scales, external data, bizCode);
* ``schema``      -- the generated flatbuffers code (``generated/``, from ``schemas/mnn``);
* ``model``       -- the format-level net: ops over indexed tensors, parameters as tables;
* ``serializer``  -- model -> flatbuffer bytes (deterministic);
* ``tensors``     -- unique tensor names and indexes; ``layout`` -- NCHW / NC4HW4 policy;
* ``idst``, ``weights`` -- weight encodings (fp16, IDST table-coded int8/int4, block scales);
* ``external``    -- the ``.weight`` side file and its integrity check;
* ``lower/``      -- Kiln ops -> MNN ops, one module per op family, merged in ``lower.table``;
* ``writer``, ``emit`` -- files and the ``--emit mnn`` emitter; ``runtime`` -- MNN as the judge.

This package imports nothing heavy on import, so ``compiler.options`` can use its options.
"""
