"""A search space: config keys with distributions, read from YAML, sampled through Optuna.

One entry per config key (a dotted path of the run config)::

    training.lr: {loguniform: [1.0e-4, 0.1]}
    model.dim: {choices: [128, 256, 512]}
    training.negatives: {int: [16, 1024], log: true, when: {training.mode: negative_sampling}}
    training.loss:                      # alternatives, each under its own condition
      - {choices: [cross_entropy, softplus, nssa], when: {training.mode: negative_sampling}}
      - {choices: [cross_entropy], when: {training.mode: [1vsall, kvsall]}}
    training.optimizer: adam            # a plain value: set in every trial

Distributions: ``uniform: [low, high]``, ``loguniform: [low, high]``, ``int: [low, high]`` (with
optional ``log: true`` and ``step``), ``choices: [...]``. ``floor: x`` (``uniform`` and ``int``,
``low < x <= high``): a drawn value below ``x`` is set to ``x`` -- LibKGE's "a negative dropout
is none", ``{uniform: [-0.5, 0.5], floor: 0.0}``, which leaves half the trials without. ``when: {key: value-or-list}`` samples
the entry only when each named key -- sampled above it, or from the base config -- has one of
the values (so a conditional entry must come after the keys it depends on). A choice of one
value is set without sampling. The Optuna parameter of an entry is its key (``key#i`` for the
i-th of several alternatives), and a trial's config is the base config with the sampled values
set, validated by the normal config model before the trial starts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.config.io import load_yaml, parse_config
from kgpipe.config.keys import config_keys, suggest_key
from kgpipe.errors import ConfigError

__all__ = [
    "Param",
    "SearchSpace",
    "describe_values",
    "read_space",
    "set_key",
    "trial_config",
]

_KINDS = ("uniform", "loguniform", "int", "choices")
_OPTIONS = {*_KINDS, "log", "step", "when", "floor"}
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Param:
    """One entry (or one alternative of an entry) of a search space."""

    key: str
    name: str  # the Optuna parameter name
    kind: str  # uniform | loguniform | int | choices | fixed
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    floor: float | int | None = None  # a drawn value below it is set to it

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the condition holds for ``values`` (config key -> value)."""
        return all(values.get(key) in allowed for key, allowed in self.when)

    def suggest(self, trial: Any) -> Any:
        """Draw a value through an Optuna trial (``trial.suggest_*``)."""
        if self.kind == "fixed":
            return self.choices[0]
        if self.kind == "choices":
            return trial.suggest_categorical(self.name, list(self.choices))
        value: float | int
        if self.kind == "int":
            step = int(self.step) if self.step else 1
            value = trial.suggest_int(
                self.name, int(self.low or 0), int(self.high or 0), step=step, log=self.log
            )
        else:
            value = trial.suggest_float(
                self.name,
                float(self.low or 0.0),
                float(self.high or 0.0),
                log=self.kind == "loguniform" or self.log,
                step=None if self.step is None else float(self.step),
            )
        return self.floor if self.floor is not None and value < self.floor else value

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one this entry can draw (a choice, or in range and on step)."""
        if self.kind in ("choices", "fixed"):
            return any(_same(value, c) for c in self.choices)
        if not _is_number(value) or (self.kind == "int" and not float(value).is_integer()):
            return False
        if self.floor is not None and float(value) <= float(self.floor):
            return float(value) == float(self.floor)  # every draw below it gives it
        low, high = float(self.low or 0), float(self.high or 0)
        if not low <= float(value) <= high:
            return False
        step = self.step or (1 if self.kind == "int" else None)
        if step is None:
            return True
        k = (float(value) - low) / float(step)
        return abs(k - round(k)) < 1e-9

    def as_drawn(self, value: Any) -> Any:
        """``value`` (:meth:`contains` it) as drawn: the choice itself (YAML's ``"1e-3"``)."""
        if self.kind in ("choices", "fixed"):
            return next(c for c in self.choices if _same(value, c))
        return value

    def describe(self) -> str:
        if self.kind in ("choices", "fixed"):
            return f"{self.key} in {list(self.choices)}"
        below = "" if self.floor is None else f" (below {self.floor}: {self.floor})"
        return f"{self.key} {self.kind} [{self.low}, {self.high}]{below}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(value: Any, choice: Any) -> bool:
    """A config value and a choice of the space: equal numbers (``16`` and ``16.0``; YAML reads
    ``1e-3`` without a dot as a string, which the config model takes as a number), else equal
    values of the same type (``True`` is not ``1``)."""
    if _is_number(value):
        if isinstance(choice, str):
            try:
                return value == float(choice)
            except ValueError:
                return False
        return _is_number(choice) and value == choice
    return type(value) is type(choice) and value == choice


def set_key(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` in a config mapping (sections created as needed)."""
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _get_key(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _number(source: str, key: str, value: Any) -> float | int:
    if isinstance(value, str) and _FLOAT.match(value):  # YAML reads 1e-5 as a string
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{source}: {key}: bounds must be numbers, got {value!r}")
    return value


def _param(source: str, key: str, name: str, spec: Any) -> Param:
    where = f"{source}: {key}"
    if not isinstance(spec, Mapping):  # a plain value
        return Param(key, name, "fixed", choices=(spec,))
    unknown = sorted(set(spec) - _OPTIONS)
    if unknown:
        raise ConfigError(f"{where}: unknown option {unknown[0]!r} (use one of {sorted(_OPTIONS)})")
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        raise ConfigError(f"{where}: give exactly one of {', '.join(_KINDS)}")
    kind = kinds[0]
    when: list[tuple[str, tuple[Any, ...]]] = []
    raw_when = spec.get("when") or {}
    if not isinstance(raw_when, Mapping):
        raise ConfigError(f"{where}: `when` must map config keys to values")
    for wkey, wval in raw_when.items():
        _check_key(source, str(wkey))
        allowed = tuple(wval) if isinstance(wval, list | tuple) else (wval,)
        when.append((str(wkey), allowed))
    if kind == "choices":
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: `choices` must be a non-empty list")
        return Param(
            key,
            name,
            "choices" if len(choices) > 1 else "fixed",
            choices=tuple(choices),
            when=tuple(when),
        )
    bounds = spec[kind]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise ConfigError(f"{where}: `{kind}` takes [low, high]")
    low, high = (_number(source, key, b) for b in bounds)
    if not low < high:
        raise ConfigError(f"{where}: low {low} must be below high {high}")
    log = bool(spec.get("log", False))
    if (kind == "loguniform" or log) and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0, got {low}")
    if kind == "int" and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"{where}: `int` bounds must be integers")
    step = spec.get("step")
    if step is not None and (log or kind == "loguniform"):
        raise ConfigError(f"{where}: `step` cannot be combined with a log scale")
    if step is not None and (
        isinstance(step, bool)
        or not isinstance(step, int | float)
        or step <= 0
        or (kind == "int" and not isinstance(step, int))
    ):
        whole = "a positive integer" if kind == "int" else "a positive number"
        raise ConfigError(f"{where}: `step` must be {whole}, got {step!r}")
    floor = spec.get("floor")
    if floor is not None:
        if kind not in ("uniform", "int") or log:
            raise ConfigError(f"{where}: `floor` goes with `uniform` or `int` (no log scale)")
        floor = _number(source, key, floor)
        if kind == "int" and not isinstance(floor, int):
            raise ConfigError(f"{where}: an `int` entry's `floor` must be an integer")
        if not low < floor <= high:
            raise ConfigError(f"{where}: `floor` {floor} must be above low and at most high")
    return Param(
        key, name, kind, low=low, high=high, log=log, step=step, when=tuple(when), floor=floor
    )


_KNOWN: frozenset[str] | None = None


def _check_key(source: str, key: str) -> None:
    global _KNOWN
    if _KNOWN is None:
        _KNOWN = frozenset(k.path for k in config_keys())
    if key in _KNOWN:
        return
    # keys under free-form mappings (storage options, tags) are not listed leaf by leaf
    if any(key.startswith(f"{k}.") for k in _KNOWN):
        return
    if under := sorted(k for k in _KNOWN if k.startswith(f"{key}.")):  # a section
        raise ConfigError(
            f"{source}: {key} is a section, not a key: a space names each key in full, "
            f"such as {under[0]}"
        )
    hint = suggest_key(key)
    extra = f" (did you mean {hint}?)" if hint else ""
    raise ConfigError(f"{source}: {key} is not a config key{extra}")


@dataclass(frozen=True)
class SearchSpace:
    """The entries of a search space, in file order."""

    params: tuple[Param, ...]
    source: str = "search space"
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_mapping(cls, data: Any, source: str = "search space") -> SearchSpace:
        if not isinstance(data, Mapping) or not data:
            raise ConfigError(f"{source}: a search space is a non-empty mapping of config keys")
        params: list[Param] = []
        for key, spec in data.items():
            key = str(key)
            _check_key(source, key)
            if isinstance(spec, list) and spec and all(isinstance(s, Mapping) for s in spec):
                if not all("when" in s for s in spec):
                    raise ConfigError(f"{source}: {key}: each alternative needs a `when`")
                params += [_param(source, key, f"{key}#{i}", s) for i, s in enumerate(spec)]
            else:
                params.append(_param(source, key, key, spec))
        return cls(tuple(params), source, dict(data))

    @classmethod
    def from_yaml(cls, text: str, source: str = "search space") -> SearchSpace:
        return cls.from_mapping(load_yaml(text, source), source)  # (a key given twice: refused)

    def sample(self, trial: Any, base: RunConfig) -> dict[str, Any]:
        """The values of one trial (config key -> value), drawn through ``trial``; keys whose
        condition does not hold keep the base config's value and are left out."""
        base_tree = base.model_dump(mode="json")
        values: dict[str, Any] = {}

        def current(key: str) -> Any:
            return values[key] if key in values else _get_key(base_tree, key)

        for param in self.params:
            view = {k: current(k) for k, _ in param.when}
            if param.applies(view):
                values[param.key] = param.suggest(trial)
        return values

    def base_params(self, base: RunConfig) -> tuple[dict[str, Any], list[str]]:
        """The base config's own values as Optuna parameters (name -> value), for a first
        trial that trains the base config (``study.enqueue_trial``); and the entries that trial
        cannot take from the base (``key=value``, set or drawn instead): a value the space
        cannot draw or a one-value entry that differs, and every entry whose condition depends
        on such a key (its branch is not known before the trial draws). Conditions are read as
        :meth:`sample` reads them: against the values set above, else the base config."""
        tree = base.model_dump(mode="json")
        params: dict[str, Any] = {}
        outside: list[str] = []
        values: dict[str, Any] = {}  # what the trial will have, as far as it is known
        unknown: set[str] = set()  # keys the trial draws (not the base's value)
        for param in self.params:
            drawn = [k for k, _ in param.when if k in unknown]
            if drawn:
                outside.append(f"{param.key} (depends on {', '.join(drawn)})")
                unknown.add(param.key)
                continue
            view = {k: values[k] if k in values else _get_key(tree, k) for k, _ in param.when}
            if not param.applies(view):
                continue
            value = _get_key(tree, param.key)
            if param.contains(value):
                values[param.key] = value
                if param.kind != "fixed":
                    params[param.name] = param.as_drawn(value)  # what Optuna may be given
            else:
                outside.append(f"{param.key}={value!r}")
                if param.kind == "fixed":
                    values[param.key] = param.choices[0]
                else:
                    unknown.add(param.key)
        return params, outside

    def enqueue_base(self, study: Any, base: RunConfig) -> str:
        """Make ``study``'s next trial the base config's own values (Optuna's
        ``enqueue_trial``; the sampler draws the others); says so, naming the entries that
        trial sets or draws instead (:meth:`base_params`)."""
        params, outside = self.base_params(base)
        study.enqueue_trial(params, user_attrs={"base_config": True, "not_from_base": outside})
        return self.base_trial_text(base)

    def base_trial_text(self, base: RunConfig) -> str:
        """What a new study's first trial (:meth:`enqueue_base`) trains, in one line."""
        outside = self.base_params(base)[1]
        unless = ", except for these base values, which the space sets or draws instead: "
        unless += ", ".join(outside)
        return "trial 0 trains the base config" + (unless if outside else "")

    def keys(self) -> list[str]:
        return list(dict.fromkeys(p.key for p in self.params))

    def describe(self) -> list[str]:
        return [p.describe() + (f" when {dict(p.when)}" if p.when else "") for p in self.params]


def read_space(url: str) -> SearchSpace:
    """The search space in the YAML file at ``url`` (any fsspec URL); a missing file, a
    folder, a file that is not text, or a bad space: one-line :class:`ConfigError`."""
    from kgpipe.config.io import read_text_file

    text = read_text_file(url, "search space")
    return SearchSpace.from_yaml(text, source=url)


def trial_config(base: RunConfig, values: Mapping[str, Any], *, source: str = "trial") -> RunConfig:
    """``base`` with ``values`` (config key -> value) set, validated as any config is (with
    the base's storage options: the JSON form left out its credentials)."""
    tree = copy.deepcopy(base.model_dump(mode="json"))
    for key, value in values.items():
        set_key(tree, key, value)
    return parse_config(tree, source=source).with_storage_options(base.given_storage_options())


def describe_values(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in values.items())


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
