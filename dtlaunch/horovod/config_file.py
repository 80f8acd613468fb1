"""horovodrun's `--config-file`: its YAML read into knob values, with horovodrun's meaning.

Sections `params`, `autotune`, `timeline`, `stall_check`, `library_options`, `logging` and the
key `controller` (only `mpi` is accepted). What horovodrun would silently ignore or crash on is a
one-line UsageError here, with the file, line and column: malformed YAML, keys horovodrun does
not know, a key given twice, values of the wrong type or out of range. A null value means "not
set", as in horovodrun. Parsing is pure; `read_horovod_config` only adds reading the file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_small_text
from dtlaunch.horovod.settings import SETTINGS, Setting

SECTIONS: dict[str, dict[str, Setting]] = {}
for _setting in SETTINGS:
    if _setting.section is not None and _setting.key is not None:
        SECTIONS.setdefault(_setting.section, {})[_setting.key] = _setting
TOP_KEYS = ("controller", *SECTIONS)
# Keys older Horovod releases read, and what replaced them.
RENAMED = {"mlsl_bgt_affinity": "thread_affinity (renamed in Horovod 0.20)"}
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class HorovodConfig:
    """Knob values a config file sets: (dest, value) as horovodrun's set_args_from_config."""

    source: str
    values: tuple[tuple[str, Any], ...] = ()
    controller: str | None = None  # "mpi" or "gloo"
    controller_where: str = ""


def _at(source: str, mark: Any) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _unknown(key: str, known: tuple[str, ...], where: str, what: str) -> UsageError:
    if key in RENAMED:
        hint = f"; use {RENAMED[key]}"
    else:
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(known)}"
    return UsageError(f"{where}: unknown key {key!r} {what}{hint}")


def _pairs(loader: Any, node: Any, source: str, what: str) -> list[tuple[str, Any, Any]]:
    """(key, key node, value node) of a mapping node; keys are names, each given once."""
    import yaml

    pairs: list[tuple[str, Any, Any]] = []
    first: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            raise UsageError(f"{_at(source, key_node.start_mark)}: expected a key name {what}")
        if key in first:
            raise UsageError(f"{_at(source, key_node.start_mark)}: {key!r} is given twice {what} "
                             f"(first on line {first[key].line + 1})")
        first[key] = key_node.start_mark
        pairs.append((key, key_node, value_node))
    return pairs


def _walk(loader: Any, root: Any, source: str) -> HorovodConfig:
    import yaml

    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
        return HorovodConfig(source)  # an empty file sets nothing
    if not isinstance(root, yaml.MappingNode):
        raise UsageError(f"{_at(source, root.start_mark)}: expected horovodrun's sections "
                         f"({', '.join(TOP_KEYS)}) at the top level")
    values: dict[str, Any] = {}
    controller: str | None = None
    controller_where = ""
    for name, key_node, node in _pairs(loader, root, source, "at the top level"):
        where = _at(source, node.start_mark)
        if name == "controller":
            value = loader.construct_object(node, deep=True)
            if value is None or value == "":
                continue
            if not isinstance(value, str) or value.lower() not in ("mpi", "gloo"):
                raise UsageError(f"{where}: controller: expected mpi, got {value!r}")
            controller, controller_where = value.lower(), where
            continue
        if name not in SECTIONS:
            raise _unknown(name, TOP_KEYS, _at(source, key_node.start_mark), "at the top level")
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            continue  # horovodrun skips an empty section
        if not isinstance(node, yaml.MappingNode):
            raise UsageError(f"{where}: {name}: expected keys and values "
                             f"({', '.join(SECTIONS[name])})")
        pairs = _pairs(loader, node, source, f"in {name}")
        for key, sub_key_node, value_node in pairs:
            setting = SECTIONS[name].get(key)
            if setting is None:
                raise _unknown(key, tuple(SECTIONS[name]), _at(source, sub_key_node.start_mark),
                               f"in {name}")
            value = loader.construct_object(value_node, deep=True)
            spot = f"{_at(source, value_node.start_mark)}: {name}.{key}"
            if value is None and key != "enabled":
                continue
            value = setting.check(value, spot)
            # stall_check.enabled is the negation of horovodrun's no_stall_check.
            values[setting.dest] = (not value) if setting.dest == "no_stall_check" else value
        # A non-empty section sets its switch even without `enabled` (horovodrun's defaults).
        if pairs and name == "autotune":
            values.setdefault("autotune", False)
        if pairs and name == "stall_check":
            values.setdefault("no_stall_check", False)
    order = [s.dest for s in SETTINGS]
    return HorovodConfig(source, tuple(sorted(values.items(), key=lambda kv: order.index(kv[0]))),
                         controller, controller_where)


def parse_horovod_config(text: str, source: str = "config file") -> HorovodConfig:
    """horovodrun's YAML config (as text) into knob values; errors name source:line:column."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        return _walk(loader, loader.get_single_node(), source)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _at(source, mark) if mark is not None else source
        problem = ", ".join(p for p in (exc.context, exc.problem) if p) or "cannot parse"
        raise UsageError(f"{where}: malformed YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{source}: malformed YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def read_horovod_config(path: str) -> HorovodConfig:
    """Read and parse `--config-file PATH`; every failure is a one-line UsageError."""
    text = read_small_text(path, "--config-file", MAX_CONFIG_BYTES, "a config file")
    return parse_horovod_config(text, path)
