"""Imports point one way: the layers of tests/layers.py hold, there is no import cycle, the
library never imports Prefect or the apps, and no module grows past ~400 lines."""

from __future__ import annotations

import shutil
from pathlib import Path

from layers import LAYERS, import_graph, modules, violations

REPO = Path(__file__).resolve().parents[1]


def test_the_library_keeps_its_layers() -> None:
    assert violations(REPO) == []


def test_every_layer_is_used_and_the_map_names_no_missing_module() -> None:
    known = modules(REPO, "kgpipe")
    for name, patterns in LAYERS:
        import fnmatch

        for p in patterns:
            assert any(fnmatch.fnmatchcase(m, p) for m in known), (name, p)


def test_the_apps_point_down_too() -> None:
    """flows compose tasks, tasks call the library; nothing imports the flows back."""
    graph = {
        **import_graph({**modules(REPO, "flows"), **modules(REPO, "tasks")}),
    }
    tasks_to_flows = [
        (src, dst) for src, edges in graph.items() for dst in edges
        if src.startswith("tasks") and dst.startswith("flows")
    ]  # fmt: skip
    assert tasks_to_flows == []


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "kgpipe", root / "kgpipe", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_a_new_upward_import_and_its_cycle_fail(tmp_path: Path) -> None:
    """What the knot between run.py and the driver was: a low module importing a high one,
    lazily, inside a function."""
    root = _copy(tmp_path)
    storage = root / "kgpipe" / "storage.py"
    storage.write_text(
        storage.read_text() + "\n\ndef _late() -> None:\n    from kgpipe.pipeline import train\n"
    )
    found = violations(root)
    assert any(
        "kgpipe.storage (base) imports kgpipe.pipeline (pipeline), a layer above it" in v
        for v in found
    ), found
    assert any(v.startswith("import cycle:") and "kgpipe.storage" in v for v in found), found


def test_a_cycle_within_one_layer_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    folder = root / "kgpipe" / "runs" / "folder.py"  # stage imports folder; now back again
    folder.write_text(folder.read_text() + "\nif False:\n    import kgpipe.runs.stage\n")
    found = violations(root)
    assert any(
        v.startswith("import cycle:") and "kgpipe.runs.folder" in v and "kgpipe.runs.stage" in v
        for v in found
    ), found
    assert not any("a layer above it" in v for v in found), found


def test_a_module_without_a_layer_or_importing_prefect_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "kgpipe" / "newthing.py").write_text("import prefect\n")
    found = violations(root)
    assert "kgpipe.newthing: in no layer (place it in tests/layers.py LAYERS)" in found
    assert "kgpipe/newthing.py:1: kgpipe.newthing imports prefect" in found


def test_a_module_over_the_size_limit_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "kgpipe" / "errors.py").write_text("x = 1\n" * 401)
    assert "kgpipe/errors.py: 401 lines (over 400)" in violations(root)
