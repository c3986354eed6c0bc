"""A study folder: what a search was asked to do, its Optuna database, its trials' run folders
and what it found.

``study.json``  the base config, the search space and the settings (``kgpipe tune --resume``)
``study.db``    the Optuna study (SQLite), unless ``settings.storage`` names another database
``trials/``     one kgpipe run folder per trial (``trial-0007``)
``results.json``, ``best.yaml``, ``trials.csv``, ``best.png``, ``importance.png``: the findings
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kgpipe.config import RunConfig
from kgpipe.config.io import parse_config
from kgpipe.errors import ConfigError, RunError
from kgpipe.runs.folder import TRIMMED as TRIMMED_MARKER
from kgpipe.tune.settings import TuneSettings
from kgpipe.tune.space import SearchSpace, trial_config

__all__ = ["StudyFolder", "create_study_folder", "open_study_folder", "trial_run_config"]

STUDY = "study.json"
#: what a finished trial other than the best gives up under ``keep_trials: best`` (it keeps its
#: config.yaml, data.json, metrics.jsonl and vocabulary)
TRIMMED = ("checkpoints", "model.safetensors", "embeddings", "data")


@dataclass(frozen=True)
class StudyFolder:
    """An existing study folder and what it holds."""

    path: Path
    base: RunConfig
    space: SearchSpace
    settings: TuneSettings

    @property
    def name(self) -> str:
        """The Optuna study's name (its settings', so a moved folder keeps its study)."""
        return self.settings.name or self.path.name

    @property
    def storage(self) -> str:
        return self.settings.storage or f"sqlite:///{(self.path / 'study.db').resolve()}"

    @property
    def trials_root(self) -> Path:
        return self.path / "trials"

    def trial_path(self, number: int) -> Path:
        """Trial ``number``'s run folder."""
        return self.trials_root / f"trial-{number:04d}"

    def trim_trials(self, finished: Iterable[int], *, keep: int | None) -> None:
        """Remove what :data:`TRIMMED` names from the run folders of the ``finished`` trials
        other than ``keep`` (the best so far), leaving ``trimmed.json`` in each (which the
        commands that need the model report). Trials already trimmed cost a ``stat`` call."""
        for number in finished:
            run = self.trial_path(number)
            if number == keep or not run.is_dir() or (run / TRIMMED_MARKER).exists():
                continue
            (run / TRIMMED_MARKER).write_text(
                json.dumps({"trimmed_by": str(self.path), "keep_trials": "best"}) + "\n"
            )
            for name in TRIMMED:
                path = run / name
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def lease(self) -> Any:
        """The study's lease (use with ``with``): held by a search, and by the testing of its
        winner, which a concurrent search's trimming would otherwise remove."""
        from kgpipe.runs.lease import RunLease
        from kgpipe.storage import Store

        return RunLease(
            Store(str(self.path.resolve())),
            ttl_s=self.base.fault_tolerance.lease_ttl_s,
            holder=f"a search of study {self.name} (kgpipe.tune)",
        )

    def file(self, name: str) -> Path:
        return self.path / name

    def write_text(self, name: str, text: str) -> Path:
        """Write ``name`` atomically (a reader never sees half a file)."""
        target = self.path / name
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        return target

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, default=str) + "\n")

    def with_settings(self, **changes: Any) -> StudyFolder:
        """The study with ``changes`` to its settings (a resume's new budget); saved by the
        search that runs it, once it holds the study (a refused second search changes
        nothing). None changes nothing, except that a budget given (``trials`` and/or
        ``timeout_s``) replaces the old one whole: ``timeout_s`` alone runs on time alone,
        and ``trials`` alone drops the old timeout (each run's clock starts anew)."""
        budget = {k: changes.pop(k, None) for k in ("trials", "timeout_s")}
        changes = {k: v for k, v in changes.items() if v is not None}
        if any(v is not None for v in budget.values()):
            # the random start-up follows the first budget, not a later one (or none)
            changes |= {**budget, "startup_trials": self.settings.startup()}
        if not changes:
            return self
        settings = TuneSettings.model_validate({**self.settings.model_dump(), **changes})
        return StudyFolder(self.path, self.base, self.space, settings)

    def save_settings(self) -> None:
        """Write this folder's settings to ``study.json`` when they differ from it."""
        saved = json.loads((self.path / STUDY).read_text()).get("settings")
        if saved != self.settings.model_dump(mode="json"):
            self._save()

    def _save(self) -> None:
        self.write_json(
            STUDY,
            {
                "base": self.base.model_dump(mode="json"),
                "space": self.space.raw,
                "settings": self.settings.model_dump(mode="json"),
            },
        )


def _default_name(base: RunConfig) -> str:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"tune-{base.model.name}-{base.data.dataset or 'custom'}-{stamp}"


def create_study_folder(base: RunConfig, space: SearchSpace, settings: TuneSettings) -> StudyFolder:
    """A new study folder under ``settings.root``; refuses an existing one (resume it instead)."""
    name = settings.name or _default_name(base)
    if settings.name is None:
        settings = settings.model_copy(update={"name": name})
    path = Path(settings.root) / name
    if (path / STUDY).exists():
        raise RunError(
            f"{path}: a study of that name exists; resume it with `kgpipe tune --resume {path}`"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / "trials").mkdir(exist_ok=True)
    folder = StudyFolder(path, base, space, settings)
    folder._save()
    return folder


def open_study_folder(path: str | Path) -> StudyFolder:
    """The study folder at ``path`` (one ``create_study_folder`` made)."""
    p = Path(str(path).removeprefix("file://"))
    source = p / STUDY
    if not source.exists():
        raise RunError(f"{p}: not a study folder (no {STUDY})")
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
        base = parse_config(data["base"], source=str(source))
        space = SearchSpace.from_mapping(data["space"], source=f"{source} (space)")
        # a study from before keep_trials kept every trial: it goes on doing so
        settings = TuneSettings.model_validate({"keep_trials": "all", **data["settings"]})
    except (KeyError, ValueError) as err:
        raise ConfigError(f"{source}: unreadable study description: {err}") from None
    return StudyFolder(p, base, space, settings)


def trial_run_config(
    folder: StudyFolder, number: int, values: dict[str, Any], threads: int | None
) -> RunConfig:
    """Trial ``number``'s run config: the base with ``values``, in the study's ``trials/``
    folder, validated but not tested (a search selects on validation only), untracked (the
    driver logs trials), with the worker's share of the cores."""
    config = trial_config(folder.base, values, source=f"trial {number}")
    training = config.training
    if threads is not None and training.threads is None:
        training = training.model_copy(update={"threads": threads})
    update: dict[str, Any] = {
        "run": config.run.model_copy(
            update={
                "root": str(folder.trials_root.resolve()),
                "name": folder.trial_path(number).name,
            }
        ),
        "evaluation": config.evaluation.model_copy(update={"test": False}),
        "training": training,
        "tracking": config.tracking.model_copy(update={"backend": "none"}),
    }
    return config.model_copy(update=update)
