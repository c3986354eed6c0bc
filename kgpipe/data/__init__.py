"""Reading knowledge graphs: files from any fsspec URL (:mod:`.io`), several formats
(:mod:`.formats`, the ``data.format`` registry), stable integer ids (:mod:`.vocab`), the named
benchmarks (:mod:`.benchmarks`), whole data sets (:mod:`.dataset`: :func:`load_dataset` turns a
``DataConfig`` into int64 ``(n, 3)`` tensors per split) and the training shards staged in a run
folder (:mod:`.shards`); synthetic graphs with planted structure for scale tests
(:mod:`.synth`).

Import from the modules: the formats sit below the config (which validates ``data.format``
against their registry), the data sets above it.
"""
