"""The config parameters of the flows: a typed ``config`` (the Prefect UI's form) or a
``config_url`` (a YAML file: a path relative to the flow run's working directory -- the
checkout, for the deployments of ``prefect.yaml`` -- or any fsspec URL), plus ``overrides``:
``key.path=value`` strings, as ``kgpipe train --set`` takes them.

Exactly one of ``config`` and ``config_url`` is given. One exception, so that a deployment's
default does not get in the way of the run's own choice: when a deployment run has both and one
of them *equals* the deployment's default (``config_url: configs/umls-complex.yaml`` of the
``train`` deployment) while the other does not, the other -- the one given for the run -- is
used. Both given for the run (neither equal to its default) is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kgpipe.config import RunConfig, apply_overrides, load_config, parse_config
from kgpipe.errors import ConfigError

# a flow run from Python starts Prefect's temporary server as the CLI does, without its
# telemetry: offline (a cluster's private network) it logs an ERROR at every start
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

__all__ = ["deployment_defaults", "flow_run_tag", "resolve_config"]


def resolve_config(
    config: RunConfig | None,
    config_url: str | None,
    overrides: Sequence[str] | None = None,
    *,
    defaults: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = dict,
    log: Callable[[str], None] | None = None,
) -> RunConfig:
    """The run's config from the flow's parameters, validated; a bad file, key or value raises
    :class:`~kgpipe.errors.ConfigError` (before any work). ``defaults``: the deployment's
    default parameters (or a function that reads them: called only when both are given)."""
    if isinstance(overrides, str) or not all(isinstance(o, str) for o in overrides or ()):
        raise ConfigError("overrides: expected a list of key.path=value strings")
    overrides = list(overrides or ())
    if config is not None and config_url:
        found = defaults() if callable(defaults) else defaults
        url_is_default = found.get("config_url") == config_url
        config_is_default = _same_config(found.get("config"), config)
        if url_is_default and not config_is_default:
            dropped = f"config_url={config_url} (the deployment's default)"
            config_url = None
        elif config_is_default and not url_is_default:
            dropped = "config (the deployment's default)"
            config = None
        else:
            raise ConfigError(
                "give either config or config_url, not both (config_url: a config file; "
                "overrides apply to either)"
            )
        if log is not None:
            log(f"using the {'config' if config is not None else 'config_url'} given for this "
                f"run, not {dropped}")  # fmt: skip
    if config_url:
        return load_config(config_url, overrides)
    if config is None:
        raise ConfigError(
            "no config: give config_url (a config file, e.g. configs/umls-complex.yaml) or "
            "config (the whole config)"
        )
    if not overrides:
        return config
    # python mode keeps the storage credentials (JSON mode redacts them)
    return parse_config(apply_overrides(config.model_dump(), overrides), source="config")


def _same_config(default: Any, config: RunConfig) -> bool:
    """Whether ``config`` is the deployment's default ``config`` parameter (given as data)."""
    if not isinstance(default, Mapping):
        return False
    try:
        return parse_config(default, source="the deployment's config") == config
    except ConfigError:
        return False


def deployment_defaults() -> dict[str, Any]:
    """The default parameters of the deployment this flow run belongs to ({} outside one)."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    if deployment.id is None:
        return {}
    with get_client(sync_client=True) as client:
        return dict(client.read_deployment(UUID(str(deployment.id))).parameters or {})


def flow_run_tag() -> str | None:
    """``NAME-ID`` of this flow run (its name, made safe for a folder, and the first 8
    characters of its id): the same for a retry of the flow run; None outside a flow run."""
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in str(flow_run.name or "run"))
    return f"{name}-{str(flow_run.id)[:8]}"
