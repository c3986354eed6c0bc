"""Distributed training on Dask: shards in storage, a gang of torch.distributed ranks, and
step- or epoch-level aggregation (see ``docs/distributed.md``).

Modules: :mod:`.sharding` (shards + manifest), :mod:`.cluster` (LocalCluster, LocalCUDACluster
or an existing scheduler), :mod:`.gang` (all-or-nothing launch), :mod:`.rank` (a rank's task),
:mod:`.comm` (exchanges and compression), :mod:`.driver` (the driver side).
"""
