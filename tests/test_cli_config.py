"""Config help: `kgpipe config`, `--version`, "did you mean" for keys, errors blamed on --set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kgpipe.cli.main import main
from kgpipe.config import RunConfig, parse_config
from kgpipe.config.keys import config_keys, suggest_key

REPO = Path(__file__).resolve().parents[1]


def test_the_defaults_listing_is_a_config_one_can_start_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kgpipe config --defaults` is YAML whose values are the model's defaults: with a data
    source added it validates into exactly the default config; every key is there, described."""
    assert main(["config", "--defaults"]) == 0
    text = capsys.readouterr().out
    data = yaml.safe_load(text)
    data["data"]["dataset"] = "umls"
    assert parse_config(data) == RunConfig.model_validate({"data": {"dataset": "umls"}})
    for key in config_keys():
        if key.type != "section or None":
            assert f"{key.path.rsplit('.', 1)[-1]}:" in text
            assert key.description, f"{key.path} has no description"
    assert "# Multiply the learning rate by this on a plateau. [float]" in text
    assert "[transe | distmult | complex | rotate]" in text  # a registry's names


def test_the_defaults_listing_filters_by_prefix_and_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "--defaults", "--json", "training.plateau"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in rows] == [
        "training.plateau.factor",
        "training.plateau.patience",
        "training.plateau.threshold",
        "training.plateau.min_lr",
    ]
    assert rows[0]["default"] == 0.5 and rows[0]["type"] == "float"
    assert main(["config", "--defaults", "trainig"]) == 2
    assert "did you mean training?" in capsys.readouterr().err


def test_a_config_is_shown_resolved(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(REPO / "configs" / "umls-complex.yaml")
    assert main(["config", "-c", cfg, "--set", "model.dim=64"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["model"]["dim"] == 64 and shown["checkpoint"]["keep_last"] == 3
    assert main(["config", "-c", cfg, "--set", "model.dim=x"]) == 2
    capsys.readouterr()
    # an option that does not apply is a one-line error, not ignored
    for argv, said in ((["--defaults", "--set", "model.dim=3"], "--set overrides a value"),
                       (["-c", cfg, "model"], "narrows --defaults only"),
                       (["--schema", "model"], "narrows --defaults only")):  # fmt: skip
        assert main(["config", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out.strip() == f"kgpipe {version('kgpipe')}"


@pytest.mark.parametrize(
    "typo,meant",
    [
        ("training.epoch", "training.epochs"),
        ("modle", "model"),
        ("training.dim", "model.dim"),  # the right name in another section
        ("distributed.worker", "distributed.workers"),
        ("training.plateau.factr", "training.plateau.factor"),
        ("model.zzzz", None),
    ],
)
def test_a_mistyped_key_gets_the_closest_known_one(typo: str, meant: str | None) -> None:
    assert suggest_key(typo) == meant


def _train(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["train", *args, "--no-prefect", "-q"]) == 2
    return capsys.readouterr().err


def test_errors_name_the_closest_key_and_blame_the_set_value_not_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(REPO / "configs" / "umls-complex.yaml")
    err = _train(["-c", good, "--set", "training.epoch=3"], capsys)
    assert err.strip() == (
        "error: --set training.epoch=3: training.epoch: unknown key (did you mean training.epochs?)"
    )
    err = _train(["-c", good, "--set", "training.epochs=abc"], capsys)
    assert err.startswith("error: --set training.epochs=abc: training.epochs: ")
    assert "umls-complex.yaml" not in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: {dataset: umls}\nmodel: {dimm: 3}\n")
    err = _train(["-c", str(bad), "--set", "training.lr=abc"], capsys)
    assert err.splitlines()[0] == f"error: {bad}: invalid configuration:"
    # the file's errors name their line; the --set value's is blamed on the item
    assert "  line 2: model.dimm: unknown key (did you mean model.dim?)" in err.splitlines()
    assert any(
        line.startswith("  training.lr: ") and line.endswith("(--set training.lr=abc)")
        for line in err.splitlines()
    ), err
    # a section's own check (dim must be even for ComplEx) names the --set item within it
    err = _train(["-c", good, "--set", "model.dim=7", "--set", "training.epochs=3"], capsys)
    line = next(i for i, x in enumerate(Path(good).read_text().splitlines(), 1) if x == "model:")
    assert err.strip() == (
        f"error: {good}, line {line}: model: model.dim must be even for complex "
        "(got 7) (with --set model.dim=7)"
    )


def test_contradicting_flags_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--resume` without run.name started a new timestamped run."""
    good = str(REPO / "configs" / "umls-complex.yaml")
    root = ["--set", f"run.root={tmp_path}"]
    err = _train(["-c", good, *root, "--resume"], capsys)
    assert "this config names none (run.name is not set)" in err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
    from kgpipe.config import load_config
    from kgpipe.errors import ConfigError
    from kgpipe.pipeline import train

    with pytest.raises(ConfigError, match="names none"):  # the library alike
        train(load_config(good, [f"run.root={tmp_path}"]), resume=True)
    assert not list(tmp_path.iterdir())


def test_set_takes_a_text_value_as_typed() -> None:
    """`--set` values were read as YAML whatever the key: `data.delimiter=|` became '', `#`
    and `!` became null (a tab-separated read, silently), `,` was a YAML error, and
    `run.name=2024` a number the config refused (`0123`: 83). Text keys take the text; null
    and quoted values, and every other key, are YAML as before."""
    from kgpipe.config import load_config

    base = str(REPO / "configs/umls-complex.yaml")
    for delimiter in ("|", "#", "!", ",", " ", ";"):
        assert load_config(base, [f"data.delimiter={delimiter}"]).data.delimiter == delimiter
    config = load_config(base, ["run.name=2024", "tracking.experiment=0123",
                                "model.dim=64", "training.lr=1e-3", "run.name='x-y'"])  # fmt: skip
    assert (config.run.name, config.tracking.experiment) == ("x-y", "0123")
    assert (config.model.dim, config.training.lr) == (64, 0.001)
    assert load_config(base, ["run.name=2024"]).run.name == "2024"
    assert load_config(base, ["data.delimiter=null"]).data.delimiter is None
    tagged = load_config(base, ["tracking.tags.v=1.10", "tracking.tags.ok=yes"])
    assert tagged.tracking.tags == {"v": "1.10", "ok": "yes"}  # (YAML: "1.1" and "true")


def test_the_json_form_hides_what_the_yaml_form_hides(capsys: pytest.CaptureFixture[str]) -> None:
    """`kgpipe config --json` printed a password given in tracking.uri (the YAML hid it)."""
    argv = ["config", "-c", str(REPO / "configs/umls-complex.yaml"),
            "--set", "tracking.uri=https://alice:s3cret@mlflow.example.com", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and json.loads(out)["tracking"]["uri"].startswith(
        "https://alice:***@"
    )


def test_a_storage_url_nothing_can_open_is_one_line() -> None:
    """A run root of an unknown scheme (or one whose package is missing) was a traceback."""
    from kgpipe.errors import StorageError
    from kgpipe.storage import Store

    with pytest.raises(StorageError, match=r"foo://x: cannot open this storage URL \(Protocol"):
        Store("foo://x")


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys: a second `training:` block silently dropped
    the first (its epochs and learning rate), in a config or a search space."""
    from kgpipe.config import load_config
    from kgpipe.errors import ConfigError
    from kgpipe.tune.space import SearchSpace

    twice = tmp_path / "twice.yaml"
    twice.write_text("training: {epochs: 5, lr: 0.1}\nmodel: {dim: 8}\n"
                     "training: {batch_size: 128}\ndata: {dataset: umls}\n")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        load_config(str(twice))
    assert str(err.value) == f"{twice}, line 3: 'training' is given twice (first at line 1)"
    with pytest.raises(ConfigError, match=r"space.yaml, line 2: 'training.lr' is given twice"):
        SearchSpace.from_yaml("training.lr: {loguniform: [1.0e-4, 0.1]}\n"
                              "training.lr: {loguniform: [1.0e-3, 0.1]}\n", "space.yaml")  # fmt: skip
    nested = tmp_path / "nested.yaml"  # the same key in two mappings is fine
    nested.write_text("data: {dataset: umls}\nmodel: {dim: 8}\ntraining: {epochs: 2}\n"
                      "evaluation: {every: 2}\ncheckpoint: {every: 2}\n")  # fmt: skip
    assert load_config(str(nested)).checkpoint.every == 2
    from kgpipe.config.io import load_yaml  # a merge's keys may be replaced, as YAML means

    merged = load_yaml("base: &b {a: 1, c: 2}\nother:\n  <<: *b\n  a: 3\n", "x.yaml")
    assert merged["other"] == {"a": 3, "c": 2}


def test_a_prefect_api_that_does_not_answer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PREFECT_API_URL (or profile) whose server has stopped: three tracebacks of 114 lines
    once the flow had started; now one line before any work."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{port}/api")
    good = str(REPO / "configs" / "umls-complex.yaml")
    code = main(["train", "-c", good, "--set", f"run.root={tmp_path}", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot reach the Prefect API at http://127.0.0.1:{port}/api" in err
    assert "--no-prefect" in err and not list(tmp_path.iterdir())


def test_an_interrupted_run_says_the_command_that_goes_on() -> None:
    """After Ctrl-C of a config without run.name, nothing said which timestamped folder to
    resume (and --resume without run.name is refused): the hint names it."""
    from kgpipe.cli.main import build_parser
    from kgpipe.cli.train import _resume_command
    from kgpipe.config import load_config

    good = str(REPO / "configs" / "umls-complex.yaml")
    args = build_parser().parse_args(
        ["train", "-c", good, "--set", "model.dim=16", "--set", "run.name=old", "--no-prefect"]
    )
    config = load_config(good, ["model.dim=16"]).with_run_name()
    said = _resume_command(args, config)
    assert said == (
        f"kgpipe train -c {good} --set model.dim=16 --set run.name={config.run.name} "
        "--no-prefect --resume"
    )
    assert config.run.name and config.run.name.startswith("complex-umls-")


def test_verbose_without_prefect_runs_and_says_it_adds_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(REPO / "configs" / "umls-complex.yaml")
    sets = ["--set", f"run.root={tmp_path}", "--set", "training.epochs=1",
            "--set", "model.dim=8", "--set", "evaluation.test=false"]  # fmt: skip
    assert main(["train", "-c", good, *sets, "--no-prefect", "-v"]) == 0
    assert "(-v adds Prefect's log lines; --orchestrator none runs without Prefect)" in (
        capsys.readouterr().err
    )


def test_yaml_shapes_a_user_writes_by_mistake_or_on_purpose(tmp_path: Path) -> None:
    """A key that is a list or a mapping was a TypeError traceback; a section with every key
    commented out (YAML's null) takes its defaults as --set does; sizes given as numbers are
    bytes, as the docs say; --set on a key under a YAML alias changes that place only (both
    places that shared the alias changed: the run folder went to the data's endpoint)."""
    from kgpipe.config import load_config
    from kgpipe.errors import ConfigError

    odd = tmp_path / "odd.yaml"
    odd.write_text("data: {dataset: umls}\n? [a, b]\n: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(odd))
    assert str(err.value) == f"{odd}, line 2: a key must be a name or a number, not a list"
    empty = tmp_path / "empty.yaml"
    empty.write_text("data: {dataset: umls}\ntraining:\n  # epochs: 5\nmodel:\n")
    config = load_config(str(empty))
    assert config.training == RunConfig.model_validate({"data": {"dataset": "umls"}}).training
    sizes = tmp_path / "sizes.yaml"
    sizes.write_text("data: {dataset: umls, memory_budget: 1073741824, block_size: 1048576}\n"
                     "distributed: {memory_limit: 3000000000}\n")  # fmt: skip
    config = load_config(str(sizes))
    assert config.distributed.memory_limit_bytes == 3_000_000_000
    assert (config.data.memory_budget_bytes, config.data.block_size_bytes) == (1 << 30, 1 << 20)
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "run: {storage_options: &so {client_kwargs: {endpoint_url: 'http://a:9000'}}}\n"
        "data: {dataset: umls, storage_options: *so}\n"
    )
    config = load_config(
        str(shared), ["data.storage_options.client_kwargs.endpoint_url=http://b:9000"]
    )
    assert config.run.storage_options["client_kwargs"]["endpoint_url"] == "http://a:9000"
    assert config.data.storage_options["client_kwargs"]["endpoint_url"] == "http://b:9000"


def test_a_regularizer_without_a_weight_is_refused_where_a_run_starts(tmp_path: Path) -> None:
    """`regularizer: {type: n3}` took the default weight 0 and trained with no penalty, without
    a word. A run read back (evaluate, predict) is not refused."""
    from kgpipe.errors import ConfigError
    from kgpipe.pipeline import train

    data = {"run": {"root": str(tmp_path), "name": "r"}, "data": {"dataset": "umls"},
            "model": {"dim": 8, "regularizer": {"type": "n3"}}, "training": {"epochs": 1}}  # fmt: skip
    config = parse_config(data)  # a config that says it is still read
    with pytest.raises(ConfigError, match=r"type=n3 with weight 0 penalises nothing"):
        train(config)
    assert not (tmp_path / "r").exists()
    import kgpipe.runs.stage as stage  # a run started before the check goes on as it was

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(stage, "_check_new_run", lambda _config: None)
        train(config)
    data["training"] = {"epochs": 2}
    assert train(parse_config(data), resume=True).history[-1].epoch == 2


def test_a_file_error_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Schema errors in a file name the line of the key (a merged key, the line it was
    given at; a key beside the merge overrides it), not only the dotted path."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "# a recipe\nbase: &b\n  lr: -0.1\n  epochs: 3\ndata:\n  dataset: umls\n"
        "training:\n  <<: *b\n  epochs: many\n"
    )
    err = _train(["-c", str(bad)], capsys).splitlines()
    assert err[0] == f"error: {bad}: invalid configuration:", err
    assert sorted(line.split(": Input")[0] for line in err[1:]) == [
        "  line 2: base: unknown key",
        "  line 3: training.lr",
        "  line 9: training.epochs",  # not line 4's, which the merge would have given
    ], err
    bad.write_text("data:\n  dataset: umls\nmodel:\n  name: complex\n\n  dim: -4\n")
    err = _train(["-c", str(bad)], capsys).strip()
    assert err == (
        f"error: {bad}, line 6: model.dim: Input should be greater than or equal to 2 (got -4)"
    )


def test_key_lines_follow_lists_merges_and_aliases() -> None:
    from kgpipe.config.io import key_line

    text = (
        "a:\n  - x: 1\n  - y:\n      z: 2\nm: &m\n  k: 1\n  j: 2\nn:\n  <<: *m\n  j: 3\n"
        "o: &o\n  p: 1\nq:\n  <<: [*o, *m]\n  r: 4\n"
    )
    line = key_line(text)
    want = {
        "a": 1, "a.0.x": 2, "a.1.y": 3, "a.1.y.z": 4, "m": 5, "m.k": 6, "m.j": 7,
        "n": 8, "n.j": 10, "n.k": 6,  # the merge's key where not given beside it
        "q.p": 12, "q.k": 6, "q.r": 15,  # a list of merges (was q.0.p, q.1.k)
        "a.2": None, "n.x": None, "x": None, "a.0.x.y": None,
    }  # fmt: skip
    assert {path: line(path) for path in want} == want
    assert key_line("")("a") is None and key_line("# nothing\n")("a") is None
    # an alias is followed, not expanded: a recursive one, and ten levels of ten
    assert key_line("x: &a\n  - *a\n")("x.0.0.0") == 1  # the anchored list's line
    nested = "l0: &l0 [1, 2]\n" + "".join(
        f"l{i}: &l{i} [{', '.join(f'*l{i - 1}' for _ in range(10))}]\n" for i in range(1, 10)
    )
    assert key_line(nested)("l9.3.3.3.3.3.3.3.3.3.1") == 1


def test_a_config_with_a_recursive_alias_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rec.yaml"
    bad.write_text("data: {dataset: umls}\nx: &a\n  - *a\n")
    err = _train(["-c", str(bad)], capsys).strip()
    assert err == f"error: {bad}, line 2: x: unknown key", err
