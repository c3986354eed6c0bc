"""Run folders: the contract of ``{run.root}/{run.name}/`` (:mod:`.folder`), staging and the
resume decision (:mod:`.stage`, :mod:`.resume`, :mod:`.warmstart`), the segment plan
(:mod:`.segments`), the callbacks that write a run's records (:mod:`.callbacks`), finishing
(:mod:`.finish`: final model, test, export, :mod:`.report`), reading runs back (:mod:`.read`)
and series of retrained runs (:mod:`.series`).
"""
