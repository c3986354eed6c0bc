"""Distributed training on Dask: clusters as configuration (:mod:`.clusters`, the
``distributed.cluster`` registry), the all-or-nothing gang launch (:mod:`.gang`) and what the
ranks exchange (:mod:`.comm`). The launcher that drives a gang and the task each rank runs are in
:mod:`kgpipe.launch`; see ``docs/distributed.md``.
"""
