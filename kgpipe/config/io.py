"""Reading and writing configs: YAML in, :class:`RunConfig` out, credentials never written.

Unknown keys are rejected with their dotted path, values are type-checked, and cross-field
rules live in ``model_validator`` hooks. ``--set a.b=c`` overrides are parsed as YAML scalars
(a text key takes the text as typed unless quoted or null) and validated like the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from kgpipe.config.base import hide_password, redact
from kgpipe.config.run import RunConfig
from kgpipe.errors import ConfigError
from kgpipe.storage import read_url

__all__ = [
    "apply_overrides",
    "config_to_yaml",
    "load_config",
    "load_yaml",
    "parse_config",
    "read_text_file",
    "redact_secrets",
]


def _blame(path: str, overrides: Mapping[str, str]) -> str | None:
    """The ``--set`` item that put the value at ``path`` there (itself or a section above it);
    an error about a whole section is the file's, even if a ``--set`` changed a key in it."""
    for key, item in overrides.items():
        if path == key or path.startswith(f"{key}."):
            return item
    return None


def _format_validation_error(
    err: ValidationError,
    source: str,
    overrides: Mapping[str, str],
    key_line: Callable[[str], int | None] | None,
) -> str:
    """``SOURCE, line N: path: problem`` for one error; ``SOURCE: invalid configuration:``
    and one indented ``line N: path: problem`` per error for several (``key_line``: the line
    of a dotted key path in the file, where known). An error in a value given with ``--set``
    is blamed on that ``--set`` item, not on the file; an unknown key gets the closest known
    one."""
    from kgpipe.config.keys import suggest_key

    lines: list[tuple[str | None, str]] = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(root)"
        if e["type"] == "extra_forbidden":
            close = suggest_key(path)
            text = f"{path}: unknown key" + (f" (did you mean {close}?)" if close else "")
        elif e["type"] == "missing":
            text = f"{path}: required"
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            # a validator's own message, without pydantic's "Value error, " before it
            message = str(e["msg"]).removeprefix("Value error, ")
            text = f"{path}: {message}{shown}"
        item = _blame(path, overrides)
        if item is None:  # a section's own check: the file and the --set items within it
            within = [
                i for k, i in overrides.items() if path == "(root)" or k.startswith(f"{path}.")
            ]
            text += f" (with --set {', --set '.join(within)})" if within else ""
            at = key_line(path) if key_line is not None else None
            text = f"line {at}: {text}" if at is not None else text
        lines.append((item, text))
    blamed = {item for item, _ in lines}
    where = source
    if None not in blamed:  # every error is in a --set value: the file is not to blame
        where = f"--set {next(iter(blamed))}" if len(blamed) == 1 else "--set"
    if len(lines) == 1:
        return f"{where}{', ' if lines[0][1].startswith('line ') else ': '}{lines[0][1]}"
    body = [
        f"  {text}" + (f"  (--set {item})" if item and where == source else "")
        for item, text in lines
    ]
    return f"{where}: invalid configuration:\n" + "\n".join(body)


_SECTIONS = frozenset(RunConfig.model_fields)


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "config",
    overrides: Mapping[str, str] | None = None,
    key_line: Callable[[str], int | None] | None = None,
) -> RunConfig:
    """Validate a mapping into a :class:`RunConfig`; errors name the dotted key path (and the
    ``--set`` item, given ``overrides``: dotted path -> the item that set it; the line in the
    file, given ``key_line``: dotted path -> line, :func:`key_line`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    # a section whose every key is commented out (`training:`) is YAML's null: its defaults
    tree = {k: {} if v is None and k in _SECTIONS else v for k, v in data.items()}
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as err:
        message = _format_validation_error(err, source, overrides or {}, key_line)
        raise ConfigError(message) from None


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    if not all(keys):
        raise ConfigError(f"--set {path}: empty key in path")
    node = tree
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {path}: {k} is not a section")
        node[k] = dict(child)  # a YAML alias shares its mapping: change a copy only
        node = node[k]
    node[keys[-1]] = value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a config mapping: values parsed as YAML, but for
    text keys (:func:`_text_field`), which take the text as typed unless quoted or null."""
    import copy

    tree: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        path, raw = item.split("=", 1)
        if _text_field(path.strip()) and raw not in _NULLS and raw[:1] not in ("'", '"'):
            value: Any = raw  # a name or a delimiter as typed: YAML read "|" as "", "#" as
            # null, "2024" as a number and "," as an error
        else:
            try:
                value = yaml.safe_load(raw) if raw != "" else ""
            except yaml.YAMLError as err:
                raise ConfigError(f"--set {item!r}: the value{yaml_error(err, raw)}") from None
        _set_path(tree, path.strip(), value)
    return tree


_NULLS = ("null", "Null", "NULL", "~")


def _text_field(path: str) -> bool:
    """Whether the config key ``path`` holds plain text: a ``str`` (or ``str | None``) field,
    or a value of a ``dict[str, str]`` field (``tracking.tags.team``)."""
    import types
    import typing

    from pydantic import BaseModel

    def kinds(annotation: Any) -> set[Any]:  # X | None -> {X, None}
        args = typing.get_args(annotation)
        return (
            set(args)
            if typing.get_origin(annotation) in (typing.Union, types.UnionType)
            else {annotation}
        )

    node: Any = RunConfig
    keys = path.split(".")
    for depth, key in enumerate(keys):
        model = next(
            (k for k in kinds(node) if isinstance(k, type) and issubclass(k, BaseModel)), None
        )
        if model is not None:
            field = model.model_fields.get(key)
            if field is None:
                return False
            node = field.annotation
        elif typing.get_origin(node) is dict and depth == len(keys) - 1:
            node = typing.get_args(node)[1]  # a value of a mapping
        else:
            return False
    found = kinds(node)
    return str in found and found <= {str, type(None)}


def yaml_error(err: yaml.YAMLError, text: str = "") -> str:
    """A YAML error as one line to follow the name of what was parsed: the line and column
    (1-based), the problem, and where the construct it broke began -- never PyYAML's
    ``<unicode string>`` placeholder or its multi-line source excerpt."""
    if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow
        line = text.count("\n", 0, err.position) + 1
        column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
        char = chr(err.character) if isinstance(err.character, int) else err.character
        return (
            f", line {line}, column {column}: not valid YAML: the character {char!r} is not "
            "allowed (a binary file?)"
        )
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return f": not valid YAML ({' '.join(str(err).split())})"
    mark = err.problem_mark
    problem = err.problem or "cannot be parsed"
    text = f", line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    if err.context and err.context_mark is not None:
        c = err.context_mark
        text += f" ({err.context} that began at line {c.line + 1}, column {c.column + 1})"
    return text


def read_text_file(url: str, kind: str) -> str:
    """The UTF-8 text of the file at ``url`` (any fsspec URL); a missing file, a folder, a
    storage error or bytes that are not text: one-line :class:`ConfigError` naming ``kind``
    (``config``, ``search space``)."""
    try:
        raw = read_url(url)
    except FileNotFoundError:
        raise ConfigError(f"{url}: {kind} file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{url}: is a directory, not a {kind} file") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{url}: cannot read {kind} ({err})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{url}, line {line}: not a text (UTF-8) file") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last:
    a second `training:` block dropped the whole first one without a word)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be replaced
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, list | dict):  # `? [a, b]` or `{a: 1}: 2`
                shape = "a list" if isinstance(key, list) else "a mapping"
                raise ConfigError(f"line {line}: a key must be a name or a number, not {shape}")
            if key in seen:
                raise ConfigError(
                    f"line {line}: {key!r} is given twice (first at line {seen[key]})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str) -> Any:
    """``text`` parsed as YAML (one mapping key once); errors name ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeys)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}{yaml_error(err, text)}") from None
    except ConfigError as err:
        raise ConfigError(f"{source}, {err}") from None


def key_line(text: str) -> Callable[[str], int | None]:
    """The line (1-based) of a dotted key path in a YAML text that loads, for the schema's
    errors: list items by their index, a key of a ``<<: *anchor`` merge (or a list of them,
    the first first) where it is not given beside it; ``None`` where the path is not there.
    The text is composed once, at the first call (only an invalid config pays for it), and
    each call walks its path only: aliases are followed, never expanded."""
    root: list[Any] = []

    def child(node: Any, part: str, seen: frozenset[int]) -> tuple[Any, int | None]:
        if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            item = node.value[int(part)]
            return item, item.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode) or id(node) in seen:
            return None, None
        merges: list[Any] = []
        for k, v in node.value:
            if k.tag == "tag:yaml.org,2002:merge":
                merges += v.value if isinstance(v, yaml.SequenceNode) else [v]
            elif isinstance(k, yaml.ScalarNode) and k.value == part:
                return v, k.start_mark.line + 1
        for m in merges:
            found = child(m, part, seen | {id(node)})
            if found[0] is not None:
                return found
        return None, None

    def line(path: str) -> int | None:
        if not root:
            root.append(yaml.compose(text, Loader=yaml.SafeLoader))
        node, at = root[0], None
        for part in path.split("."):
            node, at = child(node, part, frozenset())
            if node is None:
                return None
        return at

    return line


def load_config(url: str, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a YAML config from any fsspec URL, apply overrides and validate."""
    text = read_text_file(url, "config")
    data = load_yaml(text, url)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{url}: the top level must be a mapping")
    overrides = list(overrides)
    paths = {item.split("=", 1)[0].strip(): item for item in overrides if "=" in item}
    return parse_config(
        apply_overrides(data, overrides), source=url, overrides=paths, key_line=key_line(text)
    )


def redact_secrets(config: RunConfig) -> dict[str, Any]:
    """The config as plain data with credential-like storage options replaced by a marker
    (and a password in the tracking URI masked)."""
    data = config.model_dump(mode="json")
    for section in ("run", "data"):
        data[section]["storage_options"] = redact(data[section]["storage_options"])
    if data["tracking"].get("uri"):  # https://user:pw@host: the password is masked
        data["tracking"]["uri"] = hide_password(data["tracking"]["uri"])
    return data


def config_to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML, credentials redacted (see :func:`redact_secrets`)."""
    return yaml.safe_dump(redact_secrets(config), sort_keys=False)
