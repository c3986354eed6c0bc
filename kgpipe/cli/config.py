"""``kgpipe config``: every config key with its type, default and description, or a config file
resolved and validated the way ``kgpipe train`` would use it."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from kgpipe.config.keys import Key

NAME = "config"
HELP = "list every config key with its default and meaning, or check and resolve a config file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--defaults",
        action="store_true",
        help="every key (section.key) with its type, default and description",
    )
    what.add_argument(
        "-c",
        "--config",
        metavar="URL",
        help="validate this config (with --set) and print it resolved, defaults filled in",
    )
    what.add_argument("--schema", action="store_true", help="the config's JSON schema")
    p.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a value (with -c)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("key", nargs="?", help="only keys starting with this (with --defaults)")


def _value(default: Any) -> str:
    import yaml

    return (
        yaml.safe_dump(default, default_flow_style=True, width=10_000).strip().removesuffix("\n...")
    )


def _commented_yaml(keys: list[Key]) -> str:
    """The defaults as a YAML file one can start from: sections, keys, and each key's type and
    description as comments above it. An optional section (None by default) is ``null``, with
    its keys commented out below it."""
    out: list[str] = []
    opened: list[str] = []
    optional: list[str] = []
    for key in keys:
        *sections, leaf = key.path.split(".")
        words = f"{key.description} [{key.type}]".strip()
        under = next((p for p in optional if key.path.startswith(f"{p}.")), None)
        if under is not None:  # a key of an optional section: shown, commented out
            indent = "  " * under.count(".") + "  # "
            out += textwrap.wrap(
                f"{key.path.removeprefix(under + '.')}: {_value(key.default)}  -- {words}",
                96,
                initial_indent=f"{indent}  ",
                subsequent_indent=f"{indent}      ",
            )
            continue
        common = 0
        while common < min(len(opened), len(sections)) and opened[common] == sections[common]:
            common += 1
        for depth in range(common, len(sections)):
            out += [""] if depth == 0 else []
            out.append(f"{'  ' * depth}{sections[depth]}:")
        opened = sections
        indent = "  " * len(sections)
        out += textwrap.wrap(
            words, 96, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# "
        )
        if key.type == "section or None":
            optional.append(key.path)
            out.append(f"{indent}{leaf}: null  # or a mapping of:")
        else:
            out.append(f"{indent}{leaf}: {_value(key.default)}")
    return "\n".join(out).lstrip("\n") + "\n"


def run(args: argparse.Namespace, console: Console) -> int:
    from kgpipe.config import RunConfig, config_to_yaml, load_config, redact_secrets
    from kgpipe.config.keys import config_keys
    from kgpipe.errors import ConfigError

    if args.set and args.config is None:  # not ignored: the user meant something by it
        raise ConfigError("--set overrides a value of a config file: give the file with -c")
    if args.key and not args.defaults:
        raise ConfigError(f"a key to start with ({args.key!r}) narrows --defaults only")
    if args.schema:
        print(json.dumps(RunConfig.model_json_schema(), indent=2))
        return 0
    if args.config is not None:
        config = load_config(args.config, args.set or [])
        if args.json:
            print(json.dumps(redact_secrets(config), indent=2))  # as the YAML: no secrets
        else:
            print(config_to_yaml(config), end="")
        return 0
    keys = [k for k in config_keys() if not args.key or k.path.startswith(args.key)]
    if not keys:
        from kgpipe.config.keys import suggest_key

        close = suggest_key(args.key)
        hint = f"; did you mean {close}?" if close else ""
        raise ConfigError(f"no config key starts with {args.key!r}{hint}")
    if args.json:
        rows = [
            {"key": k.path, "type": k.type, "default": k.default, "description": k.description}
            for k in keys
            if k.type != "section or None"
        ]
        print(json.dumps(rows, indent=2, default=str))
    else:
        print(_commented_yaml(keys), end="")
    return 0
