"""The checks of a new study's search space, before any trial: its conditions (``when``), and
each value against the base config (a value a key cannot take fails at the start, not in every
trial). A study read back is not checked again (one from before a check must still open)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.errors import ConfigError
from kgpipe.tune.space import Param, SearchSpace, trial_config

__all__ = ["check_conditions", "check_space"]

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
    check_conditions(list(space.params), space.source, base)
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


def check_conditions(params: Sequence[Param], source: str, base: RunConfig | None = None) -> None:
    """Refuse a ``when`` naming a key set below it (it read the base's value in every trial),
    an entry no trial can sample (a value its key's choices never give: a typo), unless
    another alternative of its key can be (a narrowed space leaves some alternatives out),
    and two alternatives of a key that can both hold (:func:`_overlapping`)."""
    dead: dict[str, dict[str, str]] = {}  # key -> its entries no trial samples -> why
    for i, param in enumerate(params):
        for wkey, allowed in param.when:
            if any(p.key == wkey for p in params[i:]):
                raise ConfigError(
                    f"{source}: {param.key}: its `when` reads {wkey}, which the space sets "
                    f"below it: put {param.key} after {wkey}"
                )
            above = [p for p in params[:i] if p.key == wkey]
            given = above[0].choices if len(above) == 1 and not above[0].when else ()
            if given and not any(a == c for a in allowed for c in given):
                dead.setdefault(param.key, {}).setdefault(
                    param.name,
                    f"`when` asks for {wkey} in {list(allowed)}, which the space never gives "
                    f"it (its values: {list(given)})",
                )
    for key, why in dead.items():
        if len(why) == sum(p.key == key for p in params):  # none of its entries is sampled
            raise ConfigError(f"{source}: {key}: {next(iter(why.values()))}")
    _overlapping(params, source, base)  # (after: a `when` read below its key is the error)


_ANY = None  # a condition's key that may take any value


def _overlapping(params: Sequence[Param], source: str, base: RunConfig | None) -> None:
    """Refuse two alternatives of one key whose conditions can both hold: both were drawn,
    and the second overwrote the first (a wasted draw that Optuna still records, so its
    importance plot credited a value no trial used). Each condition's key takes the choices
    of its one unconditional entry above, or the base config's value where the space does not
    set it; refused only where every key so known can meet both conditions (a key set by
    alternatives of its own, or by a range, may tie its values to another's: not judged)."""
    tree = base.model_dump(mode="json") if base is not None else None

    def takes(key: str, above: Sequence[Param]) -> tuple[Any, ...] | None:
        setting = [p for p in above if p.key == key]
        if len(setting) == 1 and not setting[0].when and setting[0].choices:
            return setting[0].choices
        if not setting and tree is not None:
            node: Any = tree
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return (node,)
        return _ANY

    for j, second in enumerate(params):
        for first in params[:j]:
            if first.key != second.key:
                continue
            a, b = dict(first.when), dict(second.when)
            values = {key: takes(key, params[:j]) for key in {*a, *b}}
            if any(v is _ANY for v in values.values()):
                continue
            if all(  # each key has a value that meets both conditions
                any(x in a.get(key, v) and x in b.get(key, v) for x in v)
                for key, v in values.items()
                if v is not None
            ):
                raise ConfigError(
                    f"{source}: {second.key}: two alternatives can both hold (when {a} and "
                    f"when {b}): the second would overwrite the first; make them exclusive"
                )
