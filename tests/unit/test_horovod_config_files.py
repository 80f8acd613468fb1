"""horovodrun's config files carry over: every file horovodrun 0.28.1 accepts is accepted, with
the same HOROVOD_* variables; what horovodrun passes over in silence is one warning line.

The files: Horovod's own test configs (tests/data/horovod, every version in Horovod's history)
and generated ones with unknown, renamed and repeated keys. The oracle is Horovod's own parser
(horovod.runner.launch.parse_args, then config_parser.set_env_from_args), run on the file with
renamed keys written under their new names: dtlaunch takes an old name as the new one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.horovod_oracle import oracle_env, value_for
from helpers.suite import dtlaunch_argv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.horovod.config_file import (
    SECTIONS,
    TOP_KEYS,
    parse_horovod_config,
    read_horovod_config,
)
from dtlaunch.horovod.options import parse_horovod_args
from dtlaunch.horovod.settings import BOOL

HOROVOD_FILES = sorted((Path(__file__).parents[1] / "data" / "horovod").glob("*.yaml"))
# Keys Horovod renamed, as its history shows: (section, old) -> (new, the switch flipped).
# Newest first: where several old names of one key are given, the newest counts.
RENAMES = {("library_options", "ccl_bgt_affinity"): ("thread_affinity", False),
           ("library_options", "mlsl_bgt_affinity"): ("thread_affinity", False),
           ("logging", "hide_timestamp"): ("with_timestamp", True)}


def modernized(doc: Any) -> Any:
    """The document as Horovod 0.28.1 names its keys: an old name becomes the new one, unless
    the new one (or a newer old one) is there already."""
    if not isinstance(doc, dict):
        return doc
    doc = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    for (section, old), (new, flipped) in RENAMES.items():
        body = doc.get(section)
        if isinstance(body, dict) and old in body:
            value = body.pop(old)
            if new not in body:
                body[new] = (not value) if flipped and value is not None else value
    return doc


def oracle_for(tmp_path: Path, text: str) -> dict[str, str]:
    """Horovod's variables for the file, renamed keys under their new names."""
    path = tmp_path / "modern.yaml"
    path.write_text(yaml.safe_dump(modernized(yaml.load(text, Loader=yaml.FullLoader))))
    return oracle_env(["--config-file", str(path)])


def dtlaunch_env_of(text: str, source: str = "h.yaml") -> tuple[dict[str, str], tuple[str, ...]]:
    args = parse_horovod_args({}, parse_horovod_config(text, source))
    return dict(args.env), args.warnings


@pytest.fixture(scope="module")
def hvd_runner() -> None:
    pytest.importorskip("horovod.runner.launch", reason="Horovod is not installed")


def test_horovods_files_are_here() -> None:
    assert len(HOROVOD_FILES) == 5
    for path in HOROVOD_FILES:
        assert "Apache License" in path.read_text().splitlines()[1]


@pytest.mark.horovod
@pytest.mark.parametrize("path", HOROVOD_FILES, ids=lambda p: p.stem)
def test_horovods_own_config_files(hvd_runner: None, tmp_path: Path, path: Path) -> None:
    text = path.read_text()
    env, warnings = dtlaunch_env_of(text, str(path))
    assert env == oracle_for(tmp_path, text)
    # Against horovodrun 0.28.1 on the file as it is: only the renamed keys' variables differ.
    theirs = oracle_env(["--config-file", str(path)])
    mapped = {"HOROVOD_THREAD_AFFINITY", "HOROVOD_LOG_HIDE_TIME"}
    assert {k: v for k, v in env.items() if k not in mapped} == \
        {k: v for k, v in theirs.items() if k not in mapped}
    old = [(s, k) for (s, k) in RENAMES if k in text]
    assert len(warnings) == len(old)  # each renamed key (`controller: gloo` is taken: --gloo)
    for section, key in old:
        (line,) = [w for w in warnings if f"{section}.{key} " in w]
        assert f"renamed {section}.{RENAMES[section, key][0]}" in line
    assert all(w.startswith(f"{path}:") and "\n" not in w for w in warnings)


@pytest.mark.horovod
def test_horovods_file_on_dtlaunchs_command_line(hvd_runner: None) -> None:
    path = HOROVOD_FILES[-1]  # the one Horovod 0.28.1's tests read
    # --mpi beats the file's `controller: gloo`, as in horovodrun: the mpirun line shows values.
    result = subprocess.run(dtlaunch_argv("run", "--dry-run", "--mpi", "-H", "h1",
                                          "--config-file", str(path), "python", "train.py"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("dtlaunch: warning: ")]
    assert len(lines) == 1, result.stderr
    assert any("logging.hide_timestamp was renamed logging.with_timestamp" in w for w in lines)
    assert "HOROVOD_LOG_HIDE_TIME=1" in result.stdout  # hide_timestamp: true, taken
    assert "HOROVOD_THREAD_AFFINITY=1" in result.stdout
    # Without --mpi the file's controller counts: a Gloo job, its variables shown by name.
    gloo = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "h1", "--config-file",
                                        str(path), "python", "train.py"),
                          capture_output=True, text=True, timeout=60)
    assert gloo.returncode == 0, gloo.stderr
    assert "dtlaunch-gloo -np 1 -H h1" in gloo.stdout and "-x HOROVOD_LOG_HIDE_TIME" in gloo.stdout


@pytest.mark.parametrize(("text", "warning", "env"), [
    ("parms:\n  cycle_time_ms: 1\n",
     "h.yaml:1:1: unknown key 'parms' at the top level, ignored as horovodrun ignores it; "
     "did you mean params?", {}),
    ("params:\n  fusion_treshold_mb: 1\n  cache_capacity: 5\n",
     "h.yaml:2:3: unknown key 'fusion_treshold_mb' in params, ignored as horovodrun ignores it; "
     "did you mean fusion_threshold_mb?", {"HOROVOD_CACHE_CAPACITY": "5"}),
    ("elastic:\n  min_np: 2\n", "unknown key 'elastic' at the top level, ignored as horovodrun "
     "ignores it; known: controller, params, ", {}),
    ("params:\n  7: 1\n", "h.yaml:2:3: unknown key 7 in params", {}),
    ("library_options:\n  mlsl_bgt_affinity: 3\n",
     "h.yaml:2:3: library_options.mlsl_bgt_affinity was renamed library_options.thread_affinity "
     "in Horovod 0.19.0 (whose horovodrun ignores the old name): taken as "
     "library_options.thread_affinity", {"HOROVOD_THREAD_AFFINITY": "3"}),
    ("library_options:\n  ccl_bgt_affinity: 3\n  thread_affinity: 1\n",
     "h.yaml:2:3: library_options.ccl_bgt_affinity is Horovod's old name for "
     "library_options.thread_affinity, which is given too: ignored",
     {"HOROVOD_THREAD_AFFINITY": "1"}),
    ("logging:\n  hide_timestamp: false\n", "logging.hide_timestamp was renamed "
     "logging.with_timestamp, the opposite switch, in Horovod 0.21.0",
     {"HOROVOD_LOG_HIDE_TIME": "0"}),
    ("params:\n  cycle_time_ms: 1\n  cycle_time_ms: 2\n",
     "h.yaml:3:3: 'cycle_time_ms' is given twice in params (first on line 2); the last counts, "
     "as in horovodrun", {"HOROVOD_CYCLE_TIME": "2"}),
])
def test_what_horovodrun_ignores_is_one_warning_line(text: str, warning: str,
                                                     env: dict[str, str]) -> None:
    got, warnings = dtlaunch_env_of(text)
    assert len(warnings) == 1 and warning in warnings[0], warnings
    assert got == env


@pytest.mark.parametrize("text", [
    "params: []\n", "params: ''\n", "params: false\n", "autotune: {}\n", "controller: ''\n",
    "controller: false\n", "base: &b {cycle_time_ms: 4}\nparams:\n  <<: *b\n  cache_capacity: 1\n",
])
@pytest.mark.horovod
def test_files_horovodrun_takes_quietly(hvd_runner: None, tmp_path: Path, text: str) -> None:
    env, warnings = dtlaunch_env_of(text)
    assert env == oracle_for(tmp_path, text)
    assert len(warnings) == (1 if text.startswith("base") else 0)


def test_an_unknown_key_is_a_warning_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("params:\n  fusion_treshold_mb: 1\n")
    result = subprocess.run(dtlaunch_argv("run", "--dry-run", "-H", "h1", "--config-file",
                                          str(path), "python", "t.py"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    warned = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warned == [f"dtlaunch: warning: {path}:2:3: unknown key 'fusion_treshold_mb' in "
                      "params, ignored as horovodrun ignores it; did you mean fusion_threshold_mb?"]


# --- generated files ------------------------------------------------------------------------------

KNOWN = {key for keys in SECTIONS.values() for key in keys} | set(TOP_KEYS) | {
    key for _, key in RENAMES}
UNKNOWN = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=16).filter(
    lambda k: k not in KNOWN and k not in ("y", "n", "yes", "no", "on", "off", "true", "false",
                                           "null"))


def scalar(value: Any) -> str:
    """A value as YAML writes it (the flow form of a one-item list, without the brackets)."""
    return yaml.safe_dump([value], default_flow_style=True).strip()[1:-1]


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """A file horovodrun takes: known, unknown, renamed and repeated keys, in any order."""
    lines = []
    sections = [*SECTIONS, "controller", *draw(st.lists(UNKNOWN, max_size=2))]
    for name in draw(st.lists(st.sampled_from(sections), min_size=1, max_size=8)):
        if name == "controller":
            lines.append(f"controller: {draw(st.sampled_from(['mpi', 'MPI', 'gloo', '']))}")
            continue
        if name not in SECTIONS:
            lines.append(f"{name}: {scalar(draw(st.integers()))}")
            continue
        lines.append(f"{name}:")
        olds = [old for (section, old) in RENAMES if section == name]
        keys = [*SECTIONS[name], *olds, *draw(st.lists(UNKNOWN, max_size=2))]
        for key in draw(st.lists(st.sampled_from(keys), max_size=8)):
            setting = SECTIONS[name].get(key) or SECTIONS[name].get(
                RENAMES.get((name, key), ("",))[0])
            if setting is None:
                value: Any = draw(st.integers())
            elif setting.type == BOOL:
                value = draw(st.booleans())
            else:
                value = draw(value_for(setting.type, setting.dest))
            lines.append(f"  {key}: {scalar(value)}")
        if lines[-1] == f"{name}:":
            lines[-1] += " {}"
    return "\n".join(lines) + "\n"


@pytest.mark.horovod
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=config_texts())
def test_generated_files_give_horovods_variables(hvd_runner: None, tmp_path: Path, text: str) -> None:
    env, warnings = dtlaunch_env_of(text)
    assert env == oracle_for(tmp_path, text)
    assert all(w.startswith("h.yaml:") and "\n" not in w for w in warnings)
    for word in set(text.replace(":", " ").split()):
        if word.isidentifier() and word not in KNOWN and f"\n{word}:" in f"\n{text}":
            assert any(f"unknown key {word!r}" in w for w in warnings), (word, warnings)


def test_read_horovod_config_keeps_the_warnings(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("timeline:\n  filename: t.json\n  colour: red\n")
    config = read_horovod_config(str(path))
    assert dict(config.values) == {"timeline_filename": "t.json"}
    assert len(config.warnings) == 1 and "did you mean" not in config.warnings[0]
