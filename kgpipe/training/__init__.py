"""Training: the loop (:mod:`.loop`), one step strategy per mode (:mod:`.steps`), and their
parts -- losses, regularisers, dropout, row-wise optimisers, learning-rate schedules, seeds,
records, callbacks (:mod:`.hooks`) and the rank exchange interface (:mod:`.exchange`).

Import from the modules: the parts sit below the config (which validates names against their
registries), the loop above it.
"""
