"""horovodrun's `--config-file`: its YAML read into knob values, with horovodrun's meaning.

Sections `params`, `autotune`, `timeline`, `stall_check`, `library_options`, `logging` and the
key `controller`. Every file horovodrun 0.28.1 accepts is accepted, with the knob values it
sets; what horovodrun passes over in silence gets one warning line here, with the file, line
and column: a key it does not know (with the nearest known one; ignored, as horovodrun ignores
it), a key Horovod renamed (taken under its new name, which the line names), a key given twice
(the last counts, as in YAML loaders). `controller: gloo` runs the job with Gloo (see docs/gloo.md)
unless `--mpi` is given. What horovodrun
crashes on, or takes and then hands to Horovod as nonsense, is a one-line UsageError: malformed
YAML, a section that is not a mapping, values of the wrong type or out of range. A null value
means "not set", as in horovodrun; an empty section (`{}`, `[]`, `''`) sets nothing. Parsing is
pure; `read_horovod_config` only adds reading the file.
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


@dataclass(frozen=True)
class Renamed:
    """A key an earlier Horovod release read, and the key that replaced it."""

    new: str
    release: str  # the first release that reads only the new key
    inverted: bool = False  # a switch whose meaning flipped with the name


# Old keys, by section, newest first (the first given of a setting's names counts).
RENAMED: dict[str, dict[str, Renamed]] = {
    "library_options": {"ccl_bgt_affinity": Renamed("thread_affinity", "0.21.1"),
                        "mlsl_bgt_affinity": Renamed("thread_affinity", "0.19.0")},
    "logging": {"hide_timestamp": Renamed("with_timestamp", "0.21.0", inverted=True)},
}
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class HorovodConfig:
    """Knob values a config file sets: (dest, value) as horovodrun's set_args_from_config."""

    values: tuple[tuple[str, Any], ...] = ()
    controller: str | None = None  # "mpi" or "gloo"
    warnings: tuple[str, ...] = ()  # one line each, for what horovodrun passes over in silence


def _at(source: str, mark: Any) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}"


def _unknown(key: Any, known: tuple[str, ...], where: str, what: str) -> str:
    """The warning for a key horovodrun does not read (it ignores it, and so does dtlaunch)."""
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
    return f"{where}: unknown key {key!r} {what}, ignored as horovodrun ignores it; {hint}"


def _is_null(node: Any) -> bool:
    import yaml

    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")


def _pairs(loader: Any, node: Any, source: str, what: str,
           warnings: list[str]) -> list[tuple[Any, Any, Any]]:
    """(key, key node, value node) of a mapping node, `<<` merges applied. A key given again
    replaces the first (as yaml.load does for horovodrun), with a warning."""
    import yaml

    merged = any(k.tag == "tag:yaml.org,2002:merge" for k, _ in node.value)
    loader.flatten_mapping(node)
    pairs: dict[Any, tuple[Any, Any, Any]] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
        if key is None and not _is_null(key_node):
            raise UsageError(f"{_at(source, key_node.start_mark)}: expected a key name {what}")
        if key in pairs and not merged:
            first = pairs[key][1].start_mark.line + 1
            warnings.append(f"{_at(source, key_node.start_mark)}: {key!r} is given twice {what} "
                            f"(first on line {first}); the last counts, as in horovodrun")
        pairs.pop(key, None)
        pairs[key] = (key, key_node, value_node)
    return list(pairs.values())


def _section(loader: Any, name: str, node: Any, source: str,
             warnings: list[str]) -> dict[str, Any]:
    """One section's knob values (dest -> value)."""
    import yaml

    where = _at(source, node.start_mark)
    if not isinstance(node, yaml.MappingNode):
        if not loader.construct_object(node, deep=True):
            return {}  # horovodrun skips an empty or false section
        raise UsageError(f"{where}: {name}: expected keys and values ({', '.join(SECTIONS[name])})")
    pairs = _pairs(loader, node, source, f"in {name}", warnings)
    given = {key for key, _, _ in pairs}
    old_names = RENAMED.get(name, {})
    values: dict[str, Any] = {}
    for key, key_node, value_node in pairs:
        spot = _at(source, key_node.start_mark)
        renamed = old_names.get(key) if isinstance(key, str) else None
        if renamed is not None:
            newer = {renamed.new, *(k for k in list(old_names)[:list(old_names).index(key)]
                                    if old_names[k].new == renamed.new)}
            if given & newer:
                warnings.append(f"{spot}: {name}.{key} is Horovod's old name for {name}."
                                f"{renamed.new}, which is given too: ignored")
                continue
            flipped = ", the opposite switch," if renamed.inverted else ""
            warnings.append(f"{spot}: {name}.{key} was renamed {name}.{renamed.new}{flipped} in "
                            f"Horovod {renamed.release} (whose horovodrun ignores the old name): "
                            f"taken as {name}.{renamed.new}")
        setting = SECTIONS[name].get(renamed.new if renamed is not None else key)
        if setting is None:
            warnings.append(_unknown(key, tuple(SECTIONS[name]), spot, f"in {name}"))
            continue
        value = loader.construct_object(value_node, deep=True)
        if value is None and setting.key != "enabled":
            continue
        value = setting.check(value, f"{_at(source, value_node.start_mark)}: {name}.{key}")
        if renamed is not None and renamed.inverted:
            value = not value
        # stall_check.enabled is the negation of horovodrun's no_stall_check.
        values[setting.dest] = (not value) if setting.dest == "no_stall_check" else value
    # A non-empty section sets its switch even without `enabled` (horovodrun's defaults).
    switch = {"autotune": "autotune", "stall_check": "no_stall_check"}.get(name)
    if pairs and switch is not None:
        values.setdefault(switch, False)
    return values


def _walk(loader: Any, root: Any, source: str) -> HorovodConfig:
    import yaml

    if root is None or _is_null(root):
        return HorovodConfig()  # an empty file sets nothing
    if not isinstance(root, yaml.MappingNode):
        raise UsageError(f"{_at(source, root.start_mark)}: expected horovodrun's sections "
                         f"({', '.join(TOP_KEYS)}) at the top level")
    values: dict[str, Any] = {}
    controller: str | None = None
    warnings: list[str] = []
    for name, key_node, node in _pairs(loader, root, source, "at the top level", warnings):
        where = _at(source, node.start_mark)
        if name == "controller":
            value = loader.construct_object(node, deep=True)
            if not value:
                continue  # horovodrun: no controller given
            if not isinstance(value, str) or value.lower() not in ("mpi", "gloo"):
                raise UsageError(f"{where}: controller: expected mpi or gloo, got {value!r}")
            controller = value.lower()
        elif name in SECTIONS:
            values.update(_section(loader, name, node, source, warnings))
        else:
            warnings.append(_unknown(name, TOP_KEYS, _at(source, key_node.start_mark),
                                     "at the top level"))
    order = [s.dest for s in SETTINGS]
    return HorovodConfig(tuple(sorted(values.items(), key=lambda kv: order.index(kv[0]))),
                         controller, tuple(warnings))


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
