"""Who runs ``kgpipe train``: the library pipeline itself, or an orchestrator plugged in.

The library never imports the Prefect flows. They register themselves as an orchestrator under
the ``kgpipe.orchestrators`` entry-point group (``pyproject.toml``); an entry point names a
function ``run(config, *, resume, overwrite, callbacks, log, verbose) -> (run URL, results or
None)``: ``log`` hears what the user should read (one line each), ``verbose`` asks for the
orchestrator's own chatter too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from kgpipe.errors import ConfigError

if TYPE_CHECKING:
    from kgpipe.config import RunConfig
    from kgpipe.training.hooks import Callback

__all__ = ["GROUP", "NONE", "Orchestrator", "load_orchestrator", "orchestrator_names"]

GROUP = "kgpipe.orchestrators"
NONE = "none"  # the library pipeline, in this process


class Orchestrator(Protocol):
    def __call__(
        self,
        config: RunConfig,
        *,
        resume: bool,
        overwrite: bool,
        callbacks: Sequence[Callback],
        log: Callable[[str], None] | None,
        verbose: bool = False,
    ) -> tuple[str, dict[str, Any] | None]: ...


def orchestrator_names() -> tuple[str, ...]:
    """The installed orchestrators (``none`` is always there)."""
    return (NONE, *sorted(ep.name for ep in entry_points(group=GROUP)))


def load_orchestrator(name: str) -> Orchestrator:
    """The run function of the orchestrator ``name`` (not ``none``)."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(orchestrator_names())
        raise ConfigError(
            f"no orchestrator {name!r} is installed (installed: {known}). The Prefect flows "
            "register as 'prefect' when kgpipe is installed from its checkout (pip install "
            "-e .); --orchestrator none runs the plain library loop"
        )
    try:
        run: Orchestrator = found[0].load()
    except ImportError as err:
        raise ConfigError(
            f"the {name} orchestrator is not importable ({err}); use --orchestrator none"
        ) from None
    return run
