"""The check of a search space against its base config, before any trial: a value a key
cannot take fails at the start, not in every trial."""

from __future__ import annotations

from kgpipe.config import RunConfig
from kgpipe.errors import ConfigError
from kgpipe.tune.space import SearchSpace, trial_config

__all__ = ["check_space"]

#: the pruner's step grid: the same for every trial, so from the base config only
_STEP_GRID = ("evaluation.every", "training.epochs")


def check_space(space: SearchSpace, base: RunConfig) -> None:
    """Refuse a space with a value its key cannot take (each choice, each bound, tried alone
    on ``base``), so that a typo fails at the start and not in every trial. Values that only
    clash with other keys' values are left to each trial's validation."""
    for param in space.params:
        if param.key in _STEP_GRID:
            raise ConfigError(
                f"{space.source}: {param.key}: set it in the base config, not the space (every "
                "trial must validate at the same epochs for the pruner to compare them)"
            )
        low = param.low if param.floor is None else param.floor
        candidates = param.choices or (low, param.high)  # what a trial can be given
        drawn = None  # a range's bounds may be whole numbers, its draws are not
        if param.kind in ("uniform", "loguniform") and param.step is None:
            drawn = low + (param.high - low) * 0.375  # type: ignore[operator]
        for value in (*candidates, *([drawn] if drawn is not None else [])):
            try:
                trial_config(base, {param.key: value}, source=space.source)
            except ConfigError as err:
                if f": {param.key}: " in str(err):
                    hint = f" ({param.key} takes whole numbers: use int: [low, high])"
                    raise ConfigError(f"{err}{hint if value is drawn else ''}") from None
