"""The import rules of kgpipe, and a checker of them (read by ``tests/test_layers.py``).

Every module of the library belongs to one layer; a module may import modules of its own layer
or of layers below it, never above, and the import graph has no cycle. Every ``import`` counts:
at module level, inside functions (a "lazy" import is still a dependency) and under
``TYPE_CHECKING``. Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, so
those count too (except the importer's own packages, which are already being imported).
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: bottom to top; patterns are module names (fnmatch). A new module must be placed here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "kgpipe",
            "kgpipe.errors",
            "kgpipe.registry",
            "kgpipe.storage",
            "kgpipe.checksums",
            "kgpipe.retry",
            "kgpipe.endpoints",
            "kgpipe.process",
        ),
    ),
    (
        "parts",  # pluggable families (registries) and what they need: no config types
        (
            "kgpipe.models",
            "kgpipe.models.distances",
            "kgpipe.models.interactions",
            "kgpipe.models.spec",
            "kgpipe.devices",
            "kgpipe.training",
            "kgpipe.training.losses",
            "kgpipe.training.optim",
            "kgpipe.training.schedules",
            "kgpipe.training.regularizers",
            "kgpipe.training.rng",
            "kgpipe.training.dropout",
            "kgpipe.training.records",
            "kgpipe.training.exchange",
            "kgpipe.training.hooks",
            "kgpipe.training.steps",
            "kgpipe.training.steps.*",
            "kgpipe.data",
            "kgpipe.data.io",
            "kgpipe.data.columnar",
            "kgpipe.data.columnar_tsv",
            "kgpipe.data.columnar_parquet",
            "kgpipe.data.columnar_nt",
            "kgpipe.data.line_scan",
            "kgpipe.data.dedup",
            "kgpipe.data.split",
            "kgpipe.data.synth",
            "kgpipe.data.formats",
            "kgpipe.data.formats.*",
            "kgpipe.distributed",
            "kgpipe.distributed.clusters",
        ),
    ),
    ("config", ("kgpipe.config", "kgpipe.config.*")),
    (
        "core",  # the graph and the model, as configured
        (
            "kgpipe.models.model",
            "kgpipe.data.labels",
            "kgpipe.data.candidates",
            "kgpipe.data.vocab",
            "kgpipe.data.benchmarks",
            "kgpipe.data.sources",
            "kgpipe.data.line_reading",
            "kgpipe.data.reading",
            "kgpipe.data.dataset",
            "kgpipe.data.shards",
            "kgpipe.data.shared_triples",
        ),
    ),
    (
        "engine",  # training, evaluation, checkpoints, export, what ranks exchange
        (
            "kgpipe.training.loop",
            "kgpipe.evaluation",
            "kgpipe.query_candidates",
            "kgpipe.checkpoint",
            "kgpipe.export",
            "kgpipe.export_shards",
            "kgpipe.model_file",
            "kgpipe.distributed.comm",
            "kgpipe.distributed.sharded",
            "kgpipe.distributed.sharded_eval",
            "kgpipe.sharded_tensors",
            "kgpipe.distributed.gang",
            "kgpipe.distributed.client",
        ),
    ),
    # the run folder's steps; tracking mirrors a run into MLflow (the pipeline and a search use it)
    ("runs", ("kgpipe.runs", "kgpipe.runs.*", "kgpipe.tracking", "kgpipe.tracking.*")),
    ("factory", ("kgpipe.launch", "kgpipe.launch.base", "kgpipe.launch.build")),
    (
        "launchers",
        (
            "kgpipe.launch.in_process",
            "kgpipe.launch.rank",
            "kgpipe.launch.rank_test",
            "kgpipe.launch.memory",
            "kgpipe.launch.dask",
        ),
    ),
    ("pipeline", ("kgpipe.pipeline",)),
    # hyperparameter search: Optuna over pipeline runs (trials) on a Dask cluster
    ("tune", ("kgpipe.tune", "kgpipe.tune.*")),
    ("apps", ("kgpipe.cli", "kgpipe.cli.*")),
)

#: packages the library must never import (Prefect is the orchestrator's business)
FORBIDDEN = ("prefect", "flows", "tasks")
MAX_LINES = 400


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules(root: Path, package: str) -> dict[str, Module]:
    """Every module of ``package`` (a folder under ``root``) by dotted name."""
    out: dict[str, Module] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        out[name] = Module(name, path, is_package)
    return out


def _imported(mod: Module, tree: ast.AST) -> Iterable[tuple[str, int]]:
    """``(dotted name, line)`` of everything ``mod`` imports (names that may be modules)."""
    own_package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its own package upwards
                base = own_package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # `from pkg import submodule`
                yield f"{target}.{alias.name}", node.lineno


def import_graph(known: dict[str, Module]) -> dict[str, dict[str, int]]:
    """``{importer: {imported module: line}}`` between the modules of ``known``, with the
    packages an import runs on the way (not the importer's own)."""
    graph: dict[str, dict[str, int]] = {}
    for mod in known.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"), filename=str(mod.path))
        ancestors = {mod.name.rsplit(".", i)[0] for i in range(mod.name.count(".") + 1)}
        edges: dict[str, int] = {}
        for name, line in _imported(mod, tree):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in known and target != mod.name and target not in ancestors:
                    edges.setdefault(target, line)
        graph[mod.name] = edges
    return graph


def external_imports(known: dict[str, Module]) -> dict[str, dict[str, int]]:
    """``{module: {top-level package outside it: line}}``."""
    out: dict[str, dict[str, int]] = {}
    for mod in known.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"), filename=str(mod.path))
        for name, line in _imported(mod, tree):
            out.setdefault(mod.name, {}).setdefault(name.split(".")[0], line)
    return out


def layer_of(name: str, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS) -> int | None:
    for i, (_, patterns) in enumerate(layers):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return i
    return None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module, or a module
    importing itself), each as its modules in order, found with Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(
    root: Path,
    package: str = "kgpipe",
    layers: Sequence[tuple[str, Sequence[str]]] = LAYERS,
    *,
    forbidden: Sequence[str] = FORBIDDEN,
    max_lines: int = MAX_LINES,
) -> list[str]:
    """Every broken rule, one line each (empty when the package keeps them)."""
    known = modules(root, package)
    graph = import_graph(known)
    out: list[str] = []
    for name in sorted(known):
        if layer_of(name, layers) is None:
            out.append(f"{name}: in no layer (place it in tests/layers.py LAYERS)")
    for src, edges in sorted(graph.items()):
        a = layer_of(src, layers)
        for dst, line in sorted(edges.items()):
            b = layer_of(dst, layers)
            if a is not None and b is not None and b > a:
                out.append(
                    f"{known[src].path.relative_to(root)}:{line}: {src} ({layers[a][0]}) imports "
                    f"{dst} ({layers[b][0]}), a layer above it"
                )
    for component in cycles(graph):
        out.append(f"import cycle: {' -> '.join(component)}")
    for src, tops in sorted(external_imports(known).items()):
        for top, line in sorted(tops.items()):
            if top in forbidden:
                out.append(f"{known[src].path.relative_to(root)}:{line}: {src} imports {top}")
    for mod in known.values():
        lines = mod.path.read_text(encoding="utf-8").count("\n")
        if lines > max_lines:
            out.append(f"{mod.path.relative_to(root)}: {lines} lines (over {max_lines})")
    return out
