"""The hyperparameter search library (kgpipe.tune): spaces, trials, the study on a Dask cluster,
resume after the driver is killed, failed trials, and the findings it writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from cli_support import run_cli

from kgpipe.config import RunConfig
from kgpipe.config.io import load_config, parse_config
from kgpipe.errors import ConfigError, DataError, KgpipeError, RunError, SearchStopped
from kgpipe.runs.read import evaluate_run
from kgpipe.tune import (
    SearchSpace,
    TuneSettings,
    default_space,
    open_study_folder,
    parse_duration,
    prepare_study,
    run_and_summarize,
    search_base,
)
from kgpipe.tune.folder import TRIMMED
from kgpipe.tune.space import trial_config
from kgpipe.tune.space_check import check_space
from kgpipe.tune.study import load_optuna_study
from kgpipe.tune.trial import TrialSpec, run_trial

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "data": {"dataset": "umls"},
    "model": {"name": "complex", "dim": 16},
    "training": {
        "epochs": 4,
        "batch_size": 512,
        "loss": "cross_entropy",
        "negatives": 16,
        "lr": 0.01,
        "threads": 1,
    },
    "evaluation": {"every": 2, "batch_size": 512},
    "checkpoint": {"every": 2},
}
SPACE = """
training.lr: {loguniform: [1.0e-4, 0.1]}
model.dim: {choices: [8, 16]}
"""


def base_config(**sections: dict) -> object:
    data = json.loads(json.dumps(BASE))
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return parse_config(data)


# -- search spaces ---------------------------------------------------------------------------


def test_space_samples_conditionally_through_optuna() -> None:
    space = SearchSpace.from_yaml(
        textwrap.dedent(
            """
            training.mode: {choices: [negative_sampling, 1vsall]}
            training.loss:
              - {choices: [softplus, cross_entropy], when: {training.mode: negative_sampling}}
              - {choices: [bce], when: {training.mode: 1vsall}}
            training.negatives: {int: [4, 64], log: true, when: {training.mode: negative_sampling}}
            training.lr: {loguniform: [1.0e-4, 1.0e-1]}
            evaluation.every: 5
            """
        )
    )
    base = base_config()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    modes = set()
    for _ in range(30):
        trial = study.ask()
        values = space.sample(trial, base)
        mode = values["training.mode"]
        modes.add(mode)
        assert values["evaluation.every"] == 5  # a plain value is set in every trial
        assert 1e-4 <= values["training.lr"] <= 1e-1
        if mode == "1vsall":
            assert values["training.loss"] == "bce"  # a one-value choice is set, not sampled
            assert "training.negatives" not in values
        else:
            assert values["training.loss"] in ("softplus", "cross_entropy")
            assert 4 <= values["training.negatives"] <= 64
        config = trial_config(base, values)  # every sample validates
        assert config.training.mode == mode
        study.tell(trial, 0.0)
    assert modes == {"negative_sampling", "1vsall"}


def test_a_floor_sets_the_draws_below_it_to_it_as_libkge_reads_a_negative_dropout() -> None:
    """``{uniform: [-0.5, 0.5], floor: 0.0}``: about half the trials have no dropout at all,
    the others a uniform draw above 0; the base config's 0.0 is a value the entry draws."""
    space = SearchSpace.from_yaml(
        "model.dropout.entity: {uniform: [-0.5, 0.5], floor: 0.0}\n"
        "model.dim: {int: [-8, 32], step: 8, floor: 8}"
    )
    base = base_config()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn, dims = [], set()
    for _ in range(200):
        trial = study.ask()
        values = space.sample(trial, base)
        drawn.append(values["model.dropout.entity"])
        dims.add(values["model.dim"])
        assert trial_config(base, values).model.dropout.entity == values["model.dropout.entity"]
        study.tell(trial, 0.0)
    none = sum(v == 0.0 for v in drawn)
    assert 70 <= none <= 130, none  # the draws below 0: about half
    assert min(drawn) == 0.0 and all(0.0 < v <= 0.5 for v in drawn if v != 0.0)
    assert dims == {8, 16, 24, 32}
    dropout = space.params[0]
    assert dropout.contains(0.0) and dropout.contains(0.3) and not dropout.contains(-0.2)
    assert "below 0.0: 0.0" in dropout.describe()
    # a floor off the step grid is still a value the entry gives, so the base trial takes it
    off_grid = SearchSpace.from_yaml("model.dim: {int: [-5, 35], step: 8, floor: 16}")
    params, outside = off_grid.base_params(base_config(model={"dim": 16}))
    assert (params, outside) == ({"model.dim": 16}, [])
    check_space(off_grid, base_config())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("training.lr: {loguniform: [0.1, 1], floor: 0.2}", "`floor` goes with `uniform` or"),
        ("model.dim: {int: [-8, 32], floor: 8.5}", "`floor` must be an integer"),
        ("model.dropout.entity: {uniform: [0.0, 0.5], floor: 0.0}", "`floor` 0.0 must be above"),
        ("model.dropout.entity: {uniform: [-0.5, 0.5], floor: x}", "bounds must be numbers"),
        (
            "training.lrr: {uniform: [0.1, 1]}",
            "training.lrr is not a config key (did you mean training.lr?)",
        ),
        ("training.lr: {loguniform: [0, 1]}", "a log scale needs low > 0"),
        ("model.dim: {int: [10, 5]}", "low 10 must be below high 5"),
        ("model.dim: {int: [10, 50], sigma: 2}", "unknown option 'sigma'"),
        ("model.dim: {choices: []}", "`choices` must be a non-empty list"),
        ("training.optimizer: {choices: [adam, adamw]}", "training.optimizer: unknown optimizer"),
        (
            "training.lr: {uniform: [0.1, 1], when: {training.mod: x}}",
            "training.mod is not a config key",
        ),
        ("model.dim: {int: [10, 50], step: 0.5}", "`step` must be a positive integer"),
        ("training.lr: {uniform: [0.1, 1], step: 0}", "`step` must be a positive number"),
        ("evaluation.every: {choices: [1, 5]}", "set it in the base config, not the space"),
        ("training.epochs: 20", "set it in the base config, not the space"),
        ("[1, 2]", "a search space is a non-empty mapping"),
        ("a: [", "space.yaml"),
        # a float range on a whole-number key: every trial but the base one was refused
        ("training.negatives: {loguniform: [4, 64]}", "use int: [low, high]"),
        # a condition on a key set below: it read the base's value in every trial
        (
            "training.margin: {uniform: [0.5, 2], when: {training.loss: margin}}\n"
            "training.loss: {choices: [softplus, margin]}",
            "put training.margin after training.loss",
        ),
        (  # a value the key is never given: the entry was never sampled
            "training.loss: {choices: [softplus, margin]}\n"
            "training.margin: {uniform: [0.5, 2], when: {training.loss: margn}}",
            "which the space never gives it",
        ),
        # bounds whose difference is a multiple of 8 (the first check's test value was whole)
        ("model.dim: {uniform: [64, 512]}", "use int: [low, high]"),
        ("training.batch_size: {uniform: [256, 2048]}", "use int: [low, high]"),
        ("model.dim: {uniform: [64, 512], step: 0.5}", "use int: [low, high]"),
        ("model.regularizer: {choices: [n3]}", "model.regularizer is a section, not a key"),
        ("training:\n  lr: {uniform: [0.1, 1]}", "training is a section, not a key"),
        # alternatives whose conditions can both hold: the second draw overwrote the first
        (
            "training.optimizer: {choices: [adam, adagrad]}\n"
            "training.loss: {choices: [margin, softplus]}\ntraining.lr:\n"
            "  - {loguniform: [1.0e-4, 1.0e-2], when: {training.optimizer: adam}}\n"
            "  - {loguniform: [1.0e-2, 1.0], when: {training.loss: margin}}",
            "training.lr: two alternatives can both hold",
        ),
        (
            "training.loss: {choices: [margin, softplus, cross_entropy]}\ntraining.lr:\n"
            "  - {loguniform: [1.0e-4, 1.0e-2], when: {training.loss: [margin, softplus]}}\n"
            "  - {loguniform: [1.0e-2, 1.0], when: {training.loss: [softplus, cross_entropy]}}",
            "training.lr: two alternatives can both hold",
        ),
    ],
)
def test_bad_space_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_space(SearchSpace.from_yaml(text, source="space.yaml"), base_config())
    assert message in str(err.value)
    assert str(err.value).startswith("space.yaml")
    assert "\n" not in str(err.value)


def test_alternatives_exclusive_by_the_space_or_the_base_are_accepted() -> None:
    """Two alternatives are exclusive where one key cannot meet both conditions: by the
    choices the space gives it, or by the base config's value where the space does not set it
    (the base trains negative sampling, so a 1vsAll alternative never holds)."""
    text = (
        "training.optimizer: {choices: [adam, adagrad]}\n"
        "training.loss: {choices: [margin, softplus, cross_entropy]}\ntraining.lr:\n"
        "  - {loguniform: [1.0e-4, 1.0e-2], when: {training.loss: margin}}\n"
        "  - {loguniform: [1.0e-2, 1.0], when: {training.loss: [softplus, cross_entropy]}}\n"
        "training.batch_size:\n"
        "  - {choices: [128, 256], when: {training.mode: 1vsall}}\n"
        "  - {choices: [512, 1024], when: {training.optimizer: adam}}\n"
        # exclusive through a key set by alternatives (negatives 8 only with dim 16): not
        # judged, so not refused
        "model.dim: {choices: [16, 32]}\n"
        "training.negatives:\n"
        "  - {choices: [8], when: {model.dim: 16}}\n"
        "  - {choices: [16], when: {model.dim: 32}}\n"
        "training.chunk_size:\n"
        "  - {choices: [4], when: {training.negatives: 8}}\n"
        "  - {choices: [8], when: {model.dim: 32}}\n"
    )
    check_space(SearchSpace.from_yaml(text, source="space.yaml"), base_config())


@pytest.mark.parametrize("model", ["transe", "distmult", "complex", "rotate"])
def test_shipped_spaces_sample_valid_configs(model: str) -> None:
    space = default_space(model)
    base = base_config(model={"name": model})
    check_space(space, base)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        trial = study.ask()
        trial_config(base, space.sample(trial, base))  # raises if a sample is invalid
        study.tell(trial, 0.0)


def test_the_cpu_budget_space_is_the_shipped_space_cut_down() -> None:
    """configs/tune/spaces/transe-cpu.yaml samples valid configs of the generic WN18RR base,
    and searches a subset of the shipped TransE space (nothing it does not search there)."""
    from kgpipe.tune.space import read_space

    configs = Path(__file__).resolve().parents[1] / "configs" / "tune"
    space = read_space(str(configs / "spaces" / "transe-cpu.yaml"))
    base = load_config(str(configs / "wn18rr-transe-generic.yaml"), [])
    check_space(space, base)
    assert set(space.keys()) < set(default_space("transe").keys())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        trial = study.ask()
        config = trial_config(base, space.sample(trial, base))
        assert config.model.dim <= 256 and config.training.negatives <= 256
        assert config.training.batch_size >= 256
        assert config.model.dropout.entity == config.model.dropout.relation == 0.0
        study.tell(trial, 0.0)


def test_unreadable_space_files_are_one_line_errors(tmp_path: Path) -> None:
    from kgpipe.tune.space import read_space

    binary = tmp_path / "space.bin"
    binary.write_bytes(b"a: 1\n" + bytes(range(128, 256)))
    cases = {
        str(tmp_path / "none.yaml"): "search space file not found",
        str(tmp_path): "is a directory, not a search space file",
        str(binary): "line 2: not a text (UTF-8) file",
    }
    for url, message in cases.items():
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            read_space(url)
        assert "\n" not in str(err.value)


def test_a_narrowed_space_keeps_an_alternative_no_trial_takes() -> None:
    """An alternative whose conditions no trial meets is refused only where no alternative of
    its key is left (one dead alternative with two dead conditions counted twice); a stored
    study's space is read back without the check (a study from before it must open)."""
    narrowed = SearchSpace.from_yaml(
        "model.name: {choices: [complex]}\ntraining.optimizer: {choices: [adam]}\n"
        "training.lr:\n"
        "  - {loguniform: [1.0e-4, 0.1], when: {model.name: [distmult], training.optimizer: [sgd]}}\n"
        "  - {loguniform: [1.0e-3, 0.1], when: {model.name: [complex]}}\n"
    )
    check_space(narrowed, base_config())
    dead = "training.loss: {choices: [softplus]}\ntraining.margin: {uniform: [0.5, 2], when: {training.loss: margin}}"
    SearchSpace.from_yaml(dead, "space.yaml")  # read back: no error
    with pytest.raises(ConfigError, match="which the space never gives it"):
        check_space(SearchSpace.from_yaml(dead, "space.yaml"), base_config())


def test_bounds_written_as_yaml_reads_them() -> None:
    """YAML reads 1e-5 (no dot) as a string: the config takes it, and so does a space."""
    space = SearchSpace.from_yaml("training.lr: {loguniform: [1e-5, 1.0e-1]}")
    assert (space.params[0].low, space.params[0].high) == (1e-5, 0.1)


def test_a_relative_sqlite_storage_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study on sqlite:///rel.db resumed from another directory opened an empty database
    there (and lost its trials): the path is made absolute when the study is set up."""
    monkeypatch.chdir(tmp_path)
    settings = TuneSettings(root=str(tmp_path), storage="sqlite:///rel.db?timeout=5")
    assert settings.storage == f"sqlite:///{tmp_path / 'rel.db'}?timeout=5"
    for kept in ("sqlite:////abs/s.db", "postgresql://u:p@host/db", "sqlite://"):
        assert TuneSettings(root=str(tmp_path), storage=kept).storage == kept


def test_a_trial_keeps_the_base_configs_credentials() -> None:
    """The JSON form of a config leaves out storage credentials, so every trial of a base
    that reads S3 data with a key and secret lost them (and failed)."""
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:9000"}}
    base = base_config(run={"storage_options": options}, data={"storage_options": options})
    trial = trial_config(base, {"training.lr": 0.05})
    assert trial.run.storage_options == options and trial.data.storage_options == options
    shipped = RunConfig.model_validate(trial.model_dump(mode="json"))  # as a worker reads it
    assert "secret" not in shipped.run.storage_options
    restored = shipped.with_storage_options(trial.given_storage_options())
    assert restored.data.storage_options == options and restored == trial


def test_durations() -> None:
    assert parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("600") == 600
    assert parse_duration("1h 30m 5s") == 5405
    for bad in ("abc", "", "0", "-5m", "1h30"):  # 1h30 was an hour and 30 seconds
        with pytest.raises(ConfigError):
            parse_duration(bad)


def _pruned(pruner: object, histories: list[list[float]], every: int) -> list[int | None]:
    """Feed trials' validation curves (one value per `every` epochs) to a pruner in turn, as
    run_trial does; the epoch each was pruned at (None: ran to the end)."""
    # named: Hyperband picks a trial's bracket from a hash of the study's name and the trial's
    # number, and an unnamed study gets a random name
    study = optuna.create_study(direction="maximize", pruner=pruner, study_name="pruned")
    out: list[int | None] = []
    for values in histories:
        trial = study.ask()
        at = None
        for i, value in enumerate(values):
            trial.report(value, step=(i + 1) * every)
            if trial.should_prune():
                at = (i + 1) * every
                break
        if at is None:
            study.tell(trial, values[-1])
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        out.append(at)
    return out


def test_importances_are_quiet_with_rarely_tried_values() -> None:
    """Optuna's default evaluator warns once per conditional parameter whose branch ran in
    under two trials (a short study with a `when:` in its space has some, as WN18RR's had); the
    study's output stays quiet, the importances stay."""
    from kgpipe.tune.results import importances

    study = optuna.create_study(direction="maximize")
    x = optuna.distributions.FloatDistribution(0.0, 1.0)
    margin = optuna.distributions.FloatDistribution(0.5, 10.0)  # only when the loss is margin
    for i in range(12):
        params: dict[str, float] = {"x": i / 12}
        dists = {"x": x}
        if i == 0:
            params["margin"], dists["margin"] = 1.0, margin
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=i))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        optuna.importance.get_param_importances(study)
    assert any("Some regimes for parameter" in str(w.message) for w in seen)  # it would warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        imp = importances(study)
    assert set(imp) == {"x", "margin"}
    assert imp["x"] > imp["margin"]
    assert sum(imp.values()) == pytest.approx(1.0)


def test_pruners_stop_trials_where_their_rules_say() -> None:
    from kgpipe.tune.settings import make_pruner

    curves = [
        [0.5, 0.6, 0.7, 0.8],
        [0.4, 0.5, 0.6, 0.7],
        [0.6, 0.7, 0.8, 0.9],
        [0.1, 0.2, 0.3, 0.4],
    ]
    curves += [[0.3, 0.9, 0.9, 0.9], [0.55, 0.58, 0.6, 0.61]]
    # median: never in the first 3 trials (2 workers -> max(3, 2)) nor at the first
    # validation (warm-up 1); then pruned when its best so far is below the median of the
    # others' values at that epoch (trial 3: 0.2 < 0.55 at 10; trial 5: 0.58 < 0.6 at 10)
    median = make_pruner(TuneSettings(workers=2), first_step=5, max_step=20)
    assert _pruned(median, curves, 5) == [None, None, None, 10, None, 10]
    # ASHA, factor 3, rungs at 5, 15, 45 epochs: a trial goes on past a rung while it is in
    # the top len//3 (at least the top 1) of the values recorded there, its own included.
    # Rung 5: 0 alone; 1 (0.4 < 0.5), 3 and 4 (not the best of < 6) stop; 5 (0.55, second of
    # 6) goes on. Rung 15: 0 alone; 2 best of 2; 5 (0.6, third of 3) stops.
    asha = make_pruner(TuneSettings(pruner="asha"), first_step=5, max_step=20)
    assert _pruned(asha, curves, 5) == [None, 5, None, 5, 5, 15]
    assert TuneSettings(pruner="asha").prune_reduction == 3
    # Hyperband, 5 to 20 epochs by 3: two brackets of successive halving (a trial's bracket
    # comes from a hash of the study's name and its number), whose rungs are at 5 and 15
    # epochs; it stops trials there only, and stops some of these
    hyperband = make_pruner(TuneSettings(pruner="hyperband"), first_step=5, max_step=20)
    at = _pruned(hyperband, curves * 3, 5)
    assert {a for a in at if a is not None} <= {5, 15} and at.count(None) < len(at)


def test_a_base_that_does_not_validate_validates_at_most_five_times_a_trial(
    tmp_path: Path,
) -> None:
    """A search selects on validation: a base with ``evaluation.every: 0`` (a run's default)
    validates every ``ceil(training.epochs / 5)`` epochs (and at its last, as every run does),
    in the study's stored base; a base that validates keeps its own ``every``; a base of 0
    epochs is refused, with nothing written."""
    for epochs, every in ((10, 2), (12, 3), (14, 3), (4, 1), (1, 1), (100, 20)):
        base = base_config(evaluation={"every": 0}, training={"epochs": epochs})
        assert search_base(base).evaluation.every == every, epochs
        assert search_base(base).model_copy(update={"evaluation": base.evaluation}) == base
        assert len({*range(every, epochs + 1, every), epochs}) <= 5, epochs
    kept = base_config(evaluation={"every": 3}, training={"epochs": 10})
    assert search_base(kept) is kept
    # validating only at a trial's end (every 25 of 2 epochs) leaves a pruner nothing to act on
    late = base_config(evaluation={"every": 25}, training={"epochs": 2})
    assert search_base(late).evaluation.every == 1
    assert (
        search_base(base_config(evaluation={"every": 10}, training={"epochs": 10})).evaluation.every
        == 2
    )
    base = base_config(evaluation={"every": 0}, training={"epochs": 10})
    folder = prepare_study(base, SearchSpace.from_yaml(SPACE), TuneSettings(root=str(tmp_path)))
    assert open_study_folder(folder.path).base.evaluation.every == 2
    empty = tmp_path / "empty"
    with pytest.raises(ConfigError, match=r"training\.epochs >= 1"):
        prepare_study(
            base_config(training={"epochs": 0}), SearchSpace.from_yaml(SPACE),
            TuneSettings(root=str(empty)),
        )  # fmt: skip
    assert not empty.exists()


# -- the study ---------------------------------------------------------------------------------


def test_failing_trial_comes_back_as_data(tmp_path: Path) -> None:
    """A trial whose run cannot start is a failed outcome with its error, never an exception."""
    config = base_config(  # a trial's run is named by its study (the trial's folder)
        data={"dataset": None, "train": str(tmp_path / "missing.tsv")},
        run={"root": str(tmp_path), "name": "trial-0"},
    )
    out = run_trial(
        TrialSpec(0, 0, config.model_dump(mode="json"), "s", f"sqlite:///{tmp_path}/x.db")
    )
    assert out.state == "fail"
    assert "missing.tsv" in (out.error or "")


def test_a_search_on_data_that_does_not_read_is_refused_before_its_study_exists(
    tmp_path: Path,
) -> None:
    """A bad line failed every trial (each reading the whole graph again) and left a study
    folder behind; the base config's data is now read once, before the study is created."""
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tr\tb\nb\tr\n")
    base = base_config(data={"dataset": None, "train": str(bad)})
    settings = TuneSettings(root=str(tmp_path / "studies"), name="s", trials=3, workers=1)
    with pytest.raises(DataError, match=r"bad.tsv, line 2: expected 3 tab-separated fields"):
        prepare_study(base, SearchSpace.from_yaml(SPACE), settings)
    assert not (tmp_path / "studies").exists()


def test_a_search_whose_every_trial_fails_stops_and_says_why(tmp_path: Path) -> None:
    """Data no trial can read fails every trial at once: the search stops after
    ``max_failures`` of them in a row (not thousands, as it once did on a GPU machine) and
    names the error; the failed trials stay in the study. A search whose budget ends with as
    many failures ends as any search does."""
    from kgpipe.tune.study import run_study

    data = tmp_path / "missing.tsv"
    data.write_text("a\tr\tb\nb\tr\tc\n")  # there when the study starts (it checks), then gone
    base = base_config(data={"dataset": None, "train": str(data)})
    settings = TuneSettings(root=str(tmp_path), name="s", trials=30, workers=1, max_failures=3)
    folder = prepare_study(base, SearchSpace.from_yaml(SPACE), settings)
    spent = prepare_study(
        base, SearchSpace.from_yaml(SPACE), settings.model_copy(update={"name": "t", "trials": 3})
    )
    data.unlink()
    with pytest.raises(SearchStopped, match=r"because 3 trials in a row failed \(the last: .*"
                       r"missing\.tsv: file not found\)"):  # fmt: skip
        run_study(folder)
    states = [t.state.name for t in load_optuna_study(folder).get_trials()]
    assert states == ["FAIL"] * 3
    run_study(spent)  # its budget, not the failures, ended it
    assert [t.state.name for t in load_optuna_study(spent).get_trials()] == ["FAIL"] * 3


@pytest.mark.slow
def test_search_on_two_workers_tests_only_the_winner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = SearchSpace.from_yaml(
        SPACE
        # an invalid combination (1vsall needs cross_entropy or bce): recorded as failed
        + "training.mode: {choices: [negative_sampling, 1vsall]}\n"
        + "training.loss: {choices: [cross_entropy, softplus]}\n"
    )
    settings = TuneSettings(root=str(tmp_path), name="s", trials=8, workers=2, seed=3)
    folder = prepare_study(base_config(), space, settings)
    # the invalid pair as the first trial (in place of the base config's): seed 3 never drew
    # it, and the check of failed trials below looped over none
    invalid = {"training.mode": "1vsall", "training.loss": "softplus"}
    load_optuna_study(folder).enqueue_trial(invalid)
    events: list[tuple[str, int]] = []
    results = run_and_summarize(folder, on_event=lambda e: events.append((e.kind, e.number)))
    study = load_optuna_study(folder)
    trials = study.get_trials()
    assert len(trials) == 8
    assert sorted(n for k, n in events if k == "finished") == list(range(8))
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert failed and 0 in [t.number for t in failed]
    for t in failed:  # only the invalid combination fails, with the config's own message
        assert t.user_attrs["values"]["training.mode"] == "1vsall"
        assert "needs training.loss" in t.user_attrs["error"]
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert complete
    best = max(complete, key=lambda t: t.value)
    assert results["best"]["trial"] == best.number
    assert results["best"]["valid_mrr"] == pytest.approx(best.value)
    # the value is the best validation of the trial's own metrics
    metrics = [
        json.loads(line)
        for line in Path(best.user_attrs["run"], "metrics.jsonl").read_text().splitlines()
    ]
    assert best.value == pytest.approx(max(m["valid_mrr"] for m in metrics if "valid_mrr" in m))
    # trials never see test; the winner is tested once, after the search
    for t in trials:
        if t.user_attrs.get("run"):
            assert not Path(t.user_attrs["run"], "results.json").exists()
    assert 0 < results["best"]["test"]["mrr"] <= 1
    assert results["trials"] == {
        s: sum(t.state.name.lower() == s for t in trials) for s in results["trials"]
    }
    # the best config trains as it is
    best_yaml = folder.file("best.yaml")
    config = load_config(str(best_yaml))
    assert config.evaluation.test and config.run.name is None
    assert config.training.lr == pytest.approx(best.user_attrs["values"]["training.lr"])
    assert (folder.path / "trials.csv").read_text().count("\n") == 9
    assert folder.file("best.png").exists()
    # keep_trials: best (the default): the winner keeps its run folder whole; every other
    # finished trial keeps its config and metrics, not its model, checkpoints, embeddings, data
    kept = folder.trial_path(best.number)
    assert (kept / "checkpoints").is_dir() and (kept / "model.safetensors").is_file()
    for t in trials:
        run = folder.trial_path(t.number)
        if t.number == best.number or not run.exists():
            continue
        assert [x for x in TRIMMED if (run / x).exists()] == [], t.number
        assert (run / "trimmed.json").is_file()
        if t.state.name == "COMPLETE":
            assert (run / "metrics.jsonl").is_file() and (run / "config.yaml").is_file()
            with pytest.raises(KgpipeError, match="a trial its search trimmed"):
                evaluate_run(str(run), split="valid")
            # predict said "no model file (did training finish?)"
            code, _, err = run_cli(["predict", str(run), "--head", "x", "--relation", "y"], capsys)
            assert code == 2 and "a trial its search trimmed" in err, err


def _wait_for(predicate, timeout: float) -> None:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError("timed out")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_driver_resumes_the_study_without_repeating_trials(tmp_path: Path) -> None:
    space = SearchSpace.from_yaml(SPACE)
    base = base_config(training={"epochs": 8})
    settings = TuneSettings(
        root=str(tmp_path), name="s", trials=6, workers=2, seed=0, pruner="none"
    )
    folder = prepare_study(base, space, settings)
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from kgpipe.tune import open_study_folder, run_and_summarize
            if __name__ == "__main__":
                run_and_summarize(open_study_folder({str(folder.path)!r}))
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def finished() -> list:
        try:
            study = load_optuna_study(folder)
        except Exception:
            return []
        return [t for t in study.get_trials() if t.state.is_finished()]

    from study_support import committed_epochs, metrics_lines

    trials_root = Path(folder.trials_root)

    def committed() -> dict[int, int]:  # an unfinished trial -> its last committed epoch
        return committed_epochs(trials_root, {t.number for t in finished()})

    try:  # killed with two trials done and one interrupted after a commit
        _wait_for(lambda: (len(finished()) >= 2 and committed()) or proc.poll() is not None, 240)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its cluster, mid-study
        proc.wait()
    before = {t.number: (t.value, t.datetime_complete) for t in finished()}
    assert 2 <= len(before) < 6, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    study = load_optuna_study(folder)
    left_running = [t.number for t in study.get_trials() if t.state.name == "RUNNING"]
    commits = committed()
    assert commits and set(commits) <= set(left_running), (commits, left_running)

    trained = {n: metrics_lines(trials_root, n)[:epoch] for n, epoch in commits.items()}

    resumed = open_study_folder(folder.path)
    logs: list[str] = []
    run_and_summarize(resumed, log=logs.append)
    trials = load_optuna_study(folder).get_trials()
    assert len(trials) == 6 and all(t.state.is_finished() for t in trials)
    for t in trials:  # finished trials are kept as they were, not run again
        if t.number in before:
            assert (t.value, t.datetime_complete) == before[t.number]
    for n in left_running:  # interrupted trials continue from their checkpoint
        assert f"trial {n}:" in "\n".join(logs)
        epochs = [json.loads(m)["epoch"] for m in metrics_lines(trials_root, n)]
        assert epochs == sorted(set(epochs)), epochs  # no epoch recorded twice
    for n, lines in trained.items():  # the committed epochs were not trained again (their
        assert metrics_lines(trials_root, n)[: len(lines)] == lines, n  # timings would differ)
    assert json.loads(folder.file("results.json").read_text())["trials"]["complete"] == 6


def test_existing_study_is_refused_and_resumable(tmp_path: Path) -> None:
    settings = TuneSettings(root=str(tmp_path), name="s", trials=2)
    folder = prepare_study(base_config(), SearchSpace.from_yaml(SPACE), settings)
    with pytest.raises(RunError, match="kgpipe tune --resume"):
        prepare_study(base_config(), SearchSpace.from_yaml(SPACE), settings)
    again = open_study_folder(folder.path).with_settings(trials=5)
    assert again.settings.trials == 5
    assert again.base == folder.base and again.space.raw == folder.space.raw
    assert open_study_folder(folder.path).settings.trials == 2  # saved by the search only
    again.save_settings()
    assert open_study_folder(folder.path).settings.trials == 5
    with pytest.raises(RunError, match="not a study folder"):
        open_study_folder(tmp_path / "nothing")
    assert yaml.safe_load(SPACE) == again.space.raw


def test_trial_past_its_time_limit_is_pruned_with_what_it_validated(tmp_path: Path) -> None:
    config = base_config(
        run={"root": str(tmp_path), "name": "t"},
        training={"epochs": 400, "batch_size": 64},
        evaluation={"every": 1},
    )
    storage = f"sqlite:///{tmp_path}/x.db"
    trial = optuna.create_study(study_name="s", storage=storage).ask()
    spec = TrialSpec(
        trial.number,
        trial._trial_id,
        config.model_dump(mode="json"),
        "s",
        storage,
        pruner={"trial_timeout_s": 3.0, "pruner": "none"},
    )
    t0 = time.monotonic()
    out = run_trial(spec)
    assert time.monotonic() - t0 < 60
    assert out.state == "pruned" and "past the trial time limit" in (out.error or "")
    assert out.epochs < 400  # (how many fit in 3 s depends on the machine's load)
    assert out.timed_out and out.url == str(tmp_path / "t")  # its checkpoints hold its model
    if out.value is not None:  # scored by its best validation so far
        assert out.value == max(h["valid_mrr"] for h in out.history if "valid_mrr" in h)


def test_a_diverging_trial_is_pruned_with_what_it_validated_not_failed(tmp_path: Path) -> None:
    """A sampled learning rate that makes the loss NaN: the trial is pruned (Optuna's samplers
    learn from pruned trials, not from failed ones), scored by its validations before the loss
    diverged. Before, training went on and the NaN model's valid MRR read 1.0, the study's best."""
    config = base_config(
        run={"root": str(tmp_path), "name": "t"},
        training={"epochs": 3, "batch_size": 64, "lr": 1e20},
        evaluation={"every": 1},
    )
    storage = f"sqlite:///{tmp_path}/x.db"
    trial = optuna.create_study(study_name="s", storage=storage).ask()
    spec = TrialSpec(trial.number, trial._trial_id, config.model_dump(mode="json"), "s", storage)
    out = run_trial(spec)
    assert out.state == "pruned" and "training diverged" in (out.error or ""), out
    assert not out.timed_out and out.value is None and out.history == []


def test_a_trial_whose_folder_another_writer_holds_waits_for_it_then_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial resubmitted while its run folder is still held by itself (the task of a killed
    search that an external cluster's worker keeps running, or one a dead host held) waits for
    the lease to be released or to expire, then trains from the folder, instead of failing at
    once on "another writer is using this run folder"; any other writer fails it at once."""
    from kgpipe.runs.lease import RunLease
    from kgpipe.storage import Store
    from kgpipe.tune import trial as trial_module

    monkeypatch.setattr(trial_module, "_BUSY_WAIT_S", 0.2)
    config = base_config(run={"root": str(tmp_path), "name": "t"}, training={"epochs": 2})
    storage = f"sqlite:///{tmp_path}/x.db"
    trial = optuna.create_study(study_name="s", storage=storage).ask()
    spec = TrialSpec(trial.number, trial._trial_id, config.model_dump(mode="json"), "s", storage)
    # another writer (not this trial): refused at once, as any run is
    other = RunLease(Store(str(tmp_path / "t")), ttl_s=60.0, holder="kgpipe train")
    other.acquire()
    out = run_trial(spec)
    assert out.state == "fail" and "another writer is using this run folder" in (out.error or "")
    other.release()
    # this very trial, still running elsewhere: waited for
    holder = "trial 0 of study s (kgpipe.pipeline.train)"  # as a trial's train() names itself
    held = RunLease(Store(str(tmp_path / "t")), ttl_s=3.0, holder=holder)
    t0 = time.monotonic()
    held.acquire()  # never renewed: it expires 3 s from now
    out = run_trial(spec)
    assert out.state == "complete", out.error
    assert time.monotonic() - t0 >= 3.0  # it waited for the lease to expire
    assert [h["epoch"] for h in out.history] == [1, 2]


def test_the_best_trial_may_be_one_the_time_limit_stopped_never_one_the_pruner_stopped() -> None:
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    from kgpipe.tune.results import best_so_far, best_trial

    study = optuna.create_study(direction="maximize")
    dist = {"x": FloatDistribution(0, 1)}

    def add(state: TrialState, value: float | None, **attrs: Any) -> None:
        study.add_trial(
            create_trial(
                state=state, value=value if state == TrialState.COMPLETE else None,
                params={"x": 0.5}, distributions=dist, user_attrs=attrs,
            )
        )  # fmt: skip

    assert best_trial(study) is None
    add(TrialState.COMPLETE, 0.20, best_valid_mrr=0.20, run="r0")
    add(TrialState.PRUNED, None, best_valid_mrr=0.40, run="r1", pruned_at=10)  # the pruner's
    add(TrialState.PRUNED, None, best_valid_mrr=0.30, timed_out=True)  # no run folder known
    add(TrialState.FAIL, None, best_valid_mrr=0.50, run="r3")
    found = best_trial(study)
    assert found is not None and (found[0].number, found[1]) == (0, 0.20)
    add(TrialState.PRUNED, None, best_valid_mrr=0.25, run="r4", timed_out=True)
    found = best_trial(study)
    assert found is not None and (found[0].number, found[1]) == (4, 0.25)
    # the best-so-far curve has the same candidates: it ends at the study's best
    assert best_so_far(study) == [(0, 0.20), (1, 0.20), (2, 0.20), (3, 0.20), (4, 0.25)]
    add(TrialState.COMPLETE, 0.25, best_valid_mrr=0.25, run="r5")  # a tie: the earliest
    found = best_trial(study)
    assert found is not None and found[0].number == 4


def test_resumed_study_draws_new_values_and_a_second_search_is_refused(tmp_path: Path) -> None:
    from kgpipe.runs.lease import RunLease
    from kgpipe.storage import Store
    from kgpipe.tune.study import run_study

    settings = TuneSettings(root=str(tmp_path), name="s", trials=2, workers=1, seed=0)
    folder = prepare_study(
        base_config(training={"epochs": 2}), SearchSpace.from_yaml(SPACE), settings
    )
    run_study(folder)
    first = [t.params for t in load_optuna_study(folder).get_trials()]
    logs: list[str] = []
    run_study(open_study_folder(folder.path), log=logs.append)  # budget spent: no cluster, no trial
    assert "budget is spent" in logs[-1]
    run_study(open_study_folder(folder.path).with_settings(trials=4))
    later = [t.params for t in load_optuna_study(folder).get_trials()][2:]
    assert len(later) == 2 and all(p not in first for p in later)
    lease = RunLease(Store(str(folder.path.resolve())), ttl_s=60, holder="another search")
    with lease, pytest.raises(KgpipeError, match="another search"):
        run_study(open_study_folder(folder.path).with_settings(trials=5))
    assert open_study_folder(folder.path).settings.trials == 4  # the refused one saved nothing


def test_a_resume_given_a_budget_runs_on_that_budget_alone(tmp_path: Path) -> None:
    """`--resume --timeout` alone gives a spent study more time with no trial limit; `--trials`
    alone drops the old timeout; options that are no budget keep it."""
    settings = TuneSettings(root=str(tmp_path), name="s", trials=40, timeout_s=3600.0, seed=0)
    folder = prepare_study(base_config(), SearchSpace.from_yaml(SPACE), settings)
    kept = folder.with_settings(workers=2, trials=None, timeout_s=None).settings
    assert (kept.trials, kept.timeout_s, kept.workers) == (40, 3600.0, 2)
    timed = folder.with_settings(timeout_s=60.0).settings
    assert (timed.trials, timed.timeout_s) == (None, 60.0)
    assert timed.startup() == settings.startup() == 8  # the start-up of the first budget
    counted = folder.with_settings(trials=5).settings
    assert (counted.trials, counted.timeout_s) == (5, None)
    assert folder.with_settings(trials=None) is folder


def test_the_winner_is_tested_under_the_study_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent search of the study (a `tune --resume`) is refused while the winner is
    tested: its trimming would remove the winner's checkpoints under the test."""
    import kgpipe.runs.read as read
    from kgpipe.runs.lease import RunLease
    from kgpipe.storage import Store
    from kgpipe.tune.results import summarize

    settings = TuneSettings(root=str(tmp_path), name="s", trials=2, workers=1, seed=0)
    folder = prepare_study(
        base_config(training={"epochs": 2}), SearchSpace.from_yaml(SPACE), settings
    )
    other = RunLease(Store(str(folder.path.resolve())), ttl_s=60, holder="a resumed search")
    seen: list[str] = []
    real = read.evaluate_run

    def evaluate(*args: Any, **kwargs: Any) -> Any:
        try:
            with other:
                seen.append("the study was free")
        except KgpipeError as err:
            seen.append(str(err))
        return real(*args, **kwargs)

    monkeypatch.setattr(read, "evaluate_run", evaluate)
    results = run_and_summarize(folder)
    assert len(seen) == 1 and "a search of study s" in seen[0], seen
    assert "mrr" in results["best"]["test"]
    # the Prefect flow summarizes in a task of its own: it takes the lease itself
    with other, pytest.raises(KgpipeError, match="a resumed search"):
        summarize(open_study_folder(folder.path), load_optuna_study(folder), seconds=0.0)


def test_the_base_config_is_expressed_in_the_space_where_it_can_be() -> None:
    space = SearchSpace.from_yaml(
        """
model.dim: {choices: [8, 16, 32]}
training.negatives: {int: [4, 64], step: 4}
training.lr: {loguniform: [1.0e-4, 0.1]}
training.loss: {choices: [cross_entropy, margin]}
training.margin: {uniform: [0.5, 10.0], when: {training.loss: margin}}
training.optimizer: adam
"""
    )
    params, outside = space.base_params(base_config())
    # the margin is not drawn under the base's loss; a one-value entry needs no parameter
    assert params == {
        "model.dim": 16,
        "training.negatives": 16,
        "training.lr": 0.01,
        "training.loss": "cross_entropy",
    }
    assert outside == []
    params, outside = space.base_params(
        base_config(
            model={"dim": 12}, training={"negatives": 18, "lr": 0.5, "optimizer": "adagrad"}
        )
    )
    assert params == {"training.loss": "cross_entropy"}
    assert outside == [
        "model.dim=12",
        "training.negatives=18",  # off the step
        "training.lr=0.5",
        "training.optimizer='adagrad'",  # the space sets adam
    ]
    # conditions are read as a trial reads them: against what the space sets above, and an
    # entry that depends on a drawn key is drawn too
    space = SearchSpace.from_yaml(
        """
training.optimizer: {choices: [adam, adagrad]}
training.lr:
  - {choices: [1e-3, 1e-2], when: {training.optimizer: adam}}
  - {loguniform: [1.0e-2, 1.0], when: {training.optimizer: adagrad}}
"""
    )
    base = base_config(training={"lr": 0.001})
    params, outside = space.base_params(base)
    # YAML reads 1e-3 as the string "1e-3": the base's 0.001 is that choice, and Optuna is
    # given the choice itself (it refuses a value that is not one of the choices)
    assert params == {"training.optimizer": "adam", "training.lr#0": "1e-3"}
    assert outside == []
    study = optuna.create_study()
    space.enqueue_base(study, base)
    trial = study.ask()
    assert trial_config(base, space.sample(trial, base)).training.lr == 0.001
    by_dim = SearchSpace.from_yaml(
        """
model.dim: {choices: [32, 64]}
training.lr:
  - {loguniform: [1.0e-4, 0.1], when: {model.dim: 32}}
  - {loguniform: [1.0e-3, 0.1], when: {model.dim: 64}}
"""
    )
    params, outside = by_dim.base_params(base_config())  # base: d=16, which the trial redraws
    assert params == {}
    assert outside == [
        "model.dim=16",
        "training.lr (depends on model.dim)",
        "training.lr (depends on model.dim)",
    ]
    fixed = SearchSpace.from_yaml(
        "training.optimizer: adagrad\n"
        "training.lr: [{loguniform: [1.0e-4, 0.1], when: {training.optimizer: adam}},"
        " {loguniform: [1.0e-2, 1.0], when: {training.optimizer: adagrad}}]"
    )
    params, outside = fixed.base_params(base_config())  # base: adam at 0.01
    assert params == {"training.lr#1": 0.01}  # the adagrad branch, which the trial takes
    assert outside == ["training.optimizer='adam'"]


def test_a_new_study_starts_with_the_base_config(tmp_path: Path) -> None:
    """Trial 0 trains the base config's values (Optuna's enqueued trial); the others are
    drawn; --no-base-trial (base_trial=False) draws trial 0 too."""
    from kgpipe.tune.study import run_study

    base = base_config(training={"epochs": 2})
    firsts = {}
    for on in (True, False):
        settings = TuneSettings(
            root=str(tmp_path), name=f"s{on}", trials=2, workers=1, seed=0, base_trial=on,
            keep_trials="best" if on else "all",
        )  # fmt: skip
        folder = prepare_study(base, SearchSpace.from_yaml(SPACE), settings)
        logs: list[str] = []
        run_study(folder, log=logs.append)
        trials = load_optuna_study(folder).get_trials()
        firsts[on] = trials[0]
        assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
        # keep_trials: all keeps every trial whole; best trims the one that lost
        whole = [(folder.trial_path(t.number) / "checkpoints").is_dir() for t in trials]
        assert whole == [True, True] if not on else sorted(whole) == [False, True]
        assert ("trial 0 trains the base config" in logs) is on
    # the "all" study resumed with keep_trials: best trims its loser at once (budget spent)
    resumed = open_study_folder(tmp_path / "sFalse").with_settings(keep_trials="best")
    run_study(resumed)
    whole = [(resumed.trial_path(n) / "checkpoints").is_dir() for n in (0, 1)]
    assert sorted(whole) == [False, True]
    assert firsts[True].params == {"training.lr": 0.01, "model.dim": 16}
    assert firsts[True].user_attrs["base_config"] is True
    assert firsts[False].params != firsts[True].params
    assert "base_config" not in firsts[False].user_attrs


def test_a_study_from_before_keep_trials_keeps_every_trial(tmp_path: Path) -> None:
    folder = prepare_study(
        base_config(),
        SearchSpace.from_yaml(SPACE),
        TuneSettings(root=str(tmp_path), name="old", trials=1),
    )
    data = json.loads(folder.file("study.json").read_text())
    assert data["settings"].pop("keep_trials") == "best"  # a new study's default
    folder.file("study.json").write_text(json.dumps(data))
    assert open_study_folder(folder.path).settings.keep_trials == "all"


def test_a_shared_database_refuses_a_taken_study_name(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/shared.db"
    optuna.create_study(study_name="taken", storage=storage)
    settings = TuneSettings(root=str(tmp_path / "studies"), name="taken", storage=storage)
    with pytest.raises(ConfigError, match="has a study named 'taken' already"):
        prepare_study(base_config(), SearchSpace.from_yaml(SPACE), settings)
    assert not (tmp_path / "studies").exists()  # nothing written
    bad = TuneSettings(
        root=str(tmp_path / "studies"), name="x", storage="sqlite:////no/such/dir/x.db"
    )
    with pytest.raises(ConfigError, match="cannot open the study's database"):
        prepare_study(base_config(), SearchSpace.from_yaml(SPACE), bad)


def test_a_trial_pruned_before_its_driver_died_counts_what_it_trained(tmp_path: Path) -> None:
    """The pruner stopped a trial and the driver died before telling the study: a resume
    records it as pruned with the epochs and validations its run folder holds (counted in the
    study's trial-epochs), without training it again."""
    from kgpipe.runs.folder import METRICS
    from kgpipe.tune.study import run_study

    settings = TuneSettings(root=str(tmp_path), name="s", trials=1, workers=1, seed=0)
    folder = prepare_study(base_config(), SearchSpace.from_yaml(SPACE), settings)
    run_study(folder)  # trial 0: 4 epochs, validated at 2 and 4
    study = load_optuna_study(folder)
    done = study.get_trials()[0]
    # trial 1 as a killed driver leaves it: running, its values drawn, its run folder's
    # metrics written through epoch 4, the pruner's verdict (epoch 2) kept in the study
    orphan = study.ask()
    orphan.set_user_attr("values", done.user_attrs["values"])
    orphan.set_user_attr("pruned_at", 2)
    metrics = folder.trial_path(1) / METRICS
    metrics.parent.mkdir(parents=True)
    metrics.write_bytes((folder.trial_path(0) / METRICS).read_bytes())
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    logs: list[str] = []
    run_study(open_study_folder(folder.path).with_settings(trials=2), log=logs.append)
    # recorded, not sampled or trained again
    assert [m for m in logs if m.startswith("trial 1: ")] == [
        "trial 1: pruned at epoch 2 (recorded)"
    ]
    pruned = load_optuna_study(folder).get_trials()[1]
    assert pruned.state.name == "PRUNED"
    assert pruned.user_attrs["epochs"] == 2
    at_2 = [r["valid_mrr"] for r in rows if r["epoch"] == 2 and "valid_mrr" in r]
    assert pruned.user_attrs["best_valid_mrr"] == pytest.approx(at_2[0])
    results = run_and_summarize(open_study_folder(folder.path))
    assert results["trial_epochs"] == 4 + 2
