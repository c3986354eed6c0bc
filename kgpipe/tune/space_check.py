"""The check of a search space against its base config, before any trial: a value a key
cannot take fails at the start, not in every trial."""

from __future__ import annotations

import math

from kgpipe.config import RunConfig
from kgpipe.errors import ConfigError
from kgpipe.tune.space import SearchSpace, trial_config
from kgpipe.tune.space_conditions import check_conditions

__all__ = ["check_space"]

#: the pruner's step grid: the same for every trial, so from the base config only
_STEP_GRID = ("evaluation.every", "training.epochs")


def _fractional(low: float, high: float, step: float | None) -> float | None:
    """A value the range draws that is not a whole number, if it has one."""
    if step is not None:
        value = low + step
        return value if value <= high and value != int(value) else None
    value = math.floor(low) + 0.5
    return value if low <= value <= high else (low + high) / 2


def check_space(space: SearchSpace, base: RunConfig) -> None:
    """Refuse a space with a value its key cannot take (each choice, each bound, tried alone
    on ``base``), so that a typo fails at the start and not in every trial. Values that only
    clash with other keys' values are left to each trial's validation. Also its conditions
    (:func:`check_conditions`): checked for a new study, not where a study is read back."""
    check_conditions(list(space.params), space.source)
    for param in space.params:
        if param.key in _STEP_GRID:
            raise ConfigError(
                f"{space.source}: {param.key}: set it in the base config, not the space (every "
                "trial must validate at the same epochs for the pruner to compare them)"
            )
        low = param.low if param.floor is None else param.floor
        candidates = param.choices or (low, param.high)  # what a trial can be given
        drawn = None  # a range's bounds may be whole numbers, its draws are not
        if param.kind in ("uniform", "loguniform"):
            drawn = _fractional(low, param.high, param.step)  # type: ignore[arg-type]
        for value in (*candidates, *([drawn] if drawn is not None else [])):
            try:
                trial_config(base, {param.key: value}, source=space.source)
            except ConfigError as err:
                if f": {param.key}: " in str(err):
                    hint = f" ({param.key} takes whole numbers: use int: [low, high])"
                    raise ConfigError(f"{err}{hint if value is drawn else ''}") from None
