"""The MNN backend: writes Kiln graphs as ``.mnn`` files for Alibaba's MNN runtime.

Modules, one concern each:

* ``options``     -- :class:`MnnOptions` (weight storage, scales, external data, bizCode);
* ``model``       -- the format-level net: ops over indexed tensors, parameters as tables;
* ``serializer``  -- model -> flatbuffer bytes (deterministic);
* ``tensors``     -- unique tensor names and indexes; ``layout`` -- NCHW / NC4HW4 policy;
* ``weights``     -- weight encodings (fp16, IDST table-coded int8/int4, block scales);
* ``lower/``      -- Kiln ops -> MNN ops, one module per op family, merged in ``lower.table``;
* ``writer``, ``emit`` -- files and the ``--emit mnn`` emitter; ``runtime`` -- MNN as the judge;
* ``backend``     -- ``BACKEND``, the :class:`compiler.backend.Backend` object (flags, table, emit).

The format code it shares with the MNN frontend is in ``schemas/mnn``: ``schema`` (the
generated flatbuffers code, ``generated/``), ``idst`` and ``quantized_weights`` (the integer
weight coding and its decoding) and ``external`` (the ``.weight`` side file and its check).

This package imports nothing heavy on import, so ``compiler.options`` can use its options.
"""
