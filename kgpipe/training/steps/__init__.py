"""Step strategies, one per ``training.mode``: how a step turns a batch into row gradients.

:mod:`.base` holds the :class:`~kgpipe.training.steps.base.StepStrategy` interface and the
``STEPS`` registry; each mode is one module (:mod:`.negative_sampling`, :mod:`.one_vs_all`,
:mod:`.kvsall`), imported here so that the registry is complete once this package is.
"""

# isort: off -- the import order is the registration order, which `kgpipe ls` lists
from kgpipe.training.steps import kvsall, negative_sampling, one_vs_all
from kgpipe.training.steps.base import STEPS, StepKit, StepStrategy

# isort: on

__all__ = ["STEPS", "StepKit", "StepStrategy", "kvsall", "negative_sampling", "one_vs_all"]
