"""Launchers: how the segments of a run are trained -- in this process (:mod:`.in_process`) or
as a gang of ranks on a Dask cluster (:mod:`.dask`, each rank running :mod:`.rank`) -- behind one
:class:`~kgpipe.launch.base.Launcher` protocol; and the one trainer factory both use
(:mod:`.build`).
"""
