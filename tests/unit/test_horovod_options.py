"""horovodrun's options and config file: dtlaunch sets exactly the variables horovodrun sets.

The oracle is the installed Horovod itself: `horovod.runner.launch.parse_args` then
`config_parser.set_env_from_args`, run on the same command line and the same YAML file.
`horovod_click_options` (dtlaunch.console.options) is how the CLI declares the options.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import click
import pytest
import yaml
from helpers.horovod_oracle import oracle_env, value_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtlaunch.console.options import horovod_click_options
from dtlaunch.core.errors import UsageError
from dtlaunch.horovod.config_file import SECTIONS, parse_horovod_config, read_horovod_config
from dtlaunch.horovod.options import (
    HOROVOD_OPTIONS,
    REFUSED,
    SAME,
    SETTING,
    format_check_build,
    horovod_options,
    parse_horovod_args,
    read_horovod_args,
)
from dtlaunch.horovod.settings import BOOL, FLOAT, SETTINGS


def dtlaunch_args(argv: list[str]) -> Any:
    """Parse like `dtlaunch run ARGV python train.py` and return HorovodArgs."""
    seen: dict[str, Any] = {}

    @click.command(context_settings={"allow_interspersed_args": False})
    @horovod_click_options()
    @click.argument("command", nargs=-1, type=click.UNPROCESSED)
    def run(command: tuple[str, ...], **values: Any) -> None:
        seen["args"] = read_horovod_args(values)

    run.main([*argv, "python", "train.py"], standalone_mode=False)
    return seen["args"]


def dtlaunch_env(argv: list[str]) -> dict[str, str]:
    return dict(dtlaunch_args(argv).env)


@pytest.fixture(scope="module")
def hvd_runner() -> None:
    pytest.importorskip("horovod.runner.launch", reason="Horovod is not installed")


# --- the table covers horovodrun ------------------------------------------------------------

def horovodrun_flags() -> set[str]:
    from horovod.runner import launch

    class Grabbed(Exception):
        pass

    found: dict[str, argparse.ArgumentParser] = {}

    def grab(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        found["parser"] = self
        raise Grabbed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", grab), \
            pytest.raises(Grabbed):
        launch.parse_args()
    return set(found["parser"]._option_string_actions)


def test_every_horovodrun_option_is_in_the_table(hvd_runner: None) -> None:
    ours = {f for o in HOROVOD_OPTIONS for f in o.flags}
    theirs = horovodrun_flags() - {"-h", "--help", "-v", "--version"}
    assert theirs - ours == set()
    assert ours - theirs == {"--timeline"}  # dtlaunch's older spelling of --timeline-filename


def test_table_is_consistent() -> None:
    params = [o.param for o in HOROVOD_OPTIONS if o.kind != SAME]
    assert len(params) == len(set(params))
    flags = [f for o in HOROVOD_OPTIONS for f in o.flags]
    assert len(flags) == len(set(flags))
    dests = {o.dest for o in HOROVOD_OPTIONS if o.kind == SETTING}
    assert dests == {s.dest for s in SETTINGS}
    assert all(o.refusal for o in HOROVOD_OPTIONS if o.kind == REFUSED)


# --- the oracle, over generated flags and config files -----------------------------------------

def horovodrun_spellings(dest: str) -> list[Any]:
    return [o for o in HOROVOD_OPTIONS if o.kind == SETTING and o.dest == dest]


@st.composite
def flag_words(draw: st.DrawFn) -> list[str]:
    groups: list[list[str]] = []
    for setting in SETTINGS:
        if not draw(st.booleans()):
            continue
        option = draw(st.sampled_from(horovodrun_spellings(setting.dest)))
        flag = option.flags[0]
        if option.value == BOOL:
            groups.append([flag])
        else:
            value = draw(value_for(setting.type, setting.dest))
            groups.append([flag, str(value)])
    order = draw(st.permutations(groups)) if groups else []
    return [w for group in order for w in group]


@st.composite
def config_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["controller"] = draw(st.sampled_from(["mpi", "MPI"]))
    for section, keys in SECTIONS.items():
        if not draw(st.booleans()):
            continue
        body: dict[str, Any] = {}
        for key, setting in keys.items():
            if draw(st.booleans()):
                if setting.type == BOOL:
                    body[key] = draw(st.booleans())
                elif setting.type == FLOAT and draw(st.booleans()):
                    body[key] = draw(st.integers(0, 1))  # a whole number is a number too
                else:
                    body[key] = draw(value_for(setting.type, setting.dest))
        doc[section] = body
    return doc


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=flag_words(), doc=st.one_of(st.none(), config_documents()))
def test_variables_equal_horovodrun(hvd_runner: None, tmp_path: Path, words: list[str],
                                    doc: dict[str, Any] | None) -> None:
    argv = list(words)
    if doc is not None:
        path = tmp_path / "horovod.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv[0:0] = ["--config-file", str(path)]
    assert dtlaunch_env(argv) == oracle_env(argv)


@pytest.mark.parametrize("argv", [
    ["--fusion-threshold-mb", "0", "--cycle-time-ms", "3.5", "--cache-capacity", "2048"],
    ["--autotune", "--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "3",
     "--autotune-gaussian-process-noise", "0.8"],
    ["--autotune-log-file", "tune.csv"],  # autotune off: no autotune variables
    ["--timeline-mark-cycles"],  # no timeline file: nothing
    ["--timeline-filename", "t.json", "--no-timeline-mark-cycles"],
    ["--no-stall-check", "--stall-check-warning-time-seconds", "5"],
    ["--stall-check"],
    ["--tcp", "--mpi-threads-disable", "--thread-affinity", "1", "--num-nccl-streams", "2"],
    ["--log-level", "TRACE", "--log-hide-timestamp"],
    ["--no-log-hide-timestamp"],
    ["--no-hierarchical-allreduce", "--hierarchical-allgather", "--torus-allreduce"],
])
def test_known_combinations(hvd_runner: None, argv: list[str]) -> None:
    assert dtlaunch_env(argv) == oracle_env(argv)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "horovod.yaml"
    path.write_text(text)
    return str(path)


HOROVOD_TEST_CONFIG = """\
controller: mpi

params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: true
  hierarchical_allgather: true

autotune:
  enabled: true
  log_file: 'horovod_autotune_log.txt'
  warmup_samples: 5
  steps_per_sample: 20
  bayes_opt_max_samples: 50
  gaussian_process_noise: 0.9

timeline:
  filename: 'horovod_timeline.json'
  mark_cycles: true

stall_check:
  enabled: true
  warning_time_seconds: 120
  shutdown_time_seconds: 240

library_options:
  mpi_threads_disable: true
  num_nccl_streams: 2
  thread_affinity: 1
  gloo_timeout_seconds: 60

logging:
  level: debug
  with_timestamp: false
"""


@pytest.mark.parametrize("flags", [
    [],
    ["--fusion-threshold-mb", "4", "--no-autotune", "--no-stall-check", "--log-level", "ERROR"],
    ["--cycle-time-ms", "1", "--no-timeline-mark-cycles", "--log-with-timestamp"],
    ["--timeline-filename", "mine.json", "--no-hierarchical-allreduce"],
])
def test_a_flag_beats_the_file(hvd_runner: None, tmp_path: Path, flags: list[str]) -> None:
    path = write(tmp_path, HOROVOD_TEST_CONFIG)
    for argv in (["--config-file", path, *flags], [*flags, "--config-file", path]):
        assert dtlaunch_env(argv) == oracle_env(argv)
    env = dtlaunch_env(["--config-file", path, *flags])
    if "--fusion-threshold-mb" in flags:
        assert env["HOROVOD_FUSION_THRESHOLD"] == str(4 * 1024 * 1024)


def test_sections_set_their_switch_without_enabled(hvd_runner: None, tmp_path: Path) -> None:
    # horovodrun: a non-empty stall_check section means enabled unless it says otherwise.
    path = write(tmp_path, "stall_check:\n  warning_time_seconds: 9\nautotune:\n  log_file: x\n")
    env = dtlaunch_env(["--config-file", path])
    assert env == oracle_env(["--config-file", path])
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "0" and "HOROVOD_AUTOTUNE" not in env


@pytest.mark.parametrize("argv", [
    ["--fusion-threshold-mb", "-1"],
    ["--cycle-time-ms", "-0.5"],
    ["--autotune-gaussian-process-noise", "1.5"],
    ["--stall-check-warning-time-seconds", "-3"],
    ["--gloo-timeout-seconds", "-1"],
])
def test_out_of_range_is_refused_like_horovodrun(hvd_runner: None, argv: list[str]) -> None:
    with pytest.raises(ValueError):
        oracle_env(argv)
    with pytest.raises(UsageError, match=argv[0]):
        dtlaunch_env(argv)


# --- bad input: one line, UsageError (exit 2) ---------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--gloo", "--mpi"], "--mpi and --gloo contradict each other"),
    (["--jsrun"], "not with LSF's jsrun"),
    (["--max-np", "2", "--max-num-proc", "4"], "--max-np/--max-num-proc: given more than once"),
    (["--autotune", "--no-autotune"], "--autotune and --no-autotune contradict each other"),
    (["--log-with-timestamp", "--log-hide-timestamp"], "contradict each other"),
    (["--timeline", "a.json", "--timeline-filename", "b.json"], "--timeline-filename/--timeline: given more than once"),
    (["--config-file", "a.yaml", "--config-file", "b.yaml"], "--config-file: given more than once"),
    (["--fusion-threshold-mb", "1", "--fusion-threshold-mb", "2"], "given more than once"),
    (["--log-level", "LOUD"], "expected one of TRACE"),
    (["--start-timeout", "0"], "between 1 second and a day"),
    (["--binding-args", "-bind-to 'core"], "cannot split"),
    (["--network-interfaces", "eth0,,eth1"], "empty interface name"),
])
def test_bad_flags(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        dtlaunch_env(argv)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_elastic_options_are_carried_for_the_elastic_spec() -> None:
    # horovodrun's elastic options, once refused, now reach dtlaunch's elastic mode as given
    # (their meaning is checked by dtlaunch.job.elastic.elastic_spec).
    args = dtlaunch_args(["--min-num-proc", "2", "--max-num-proc", "4",
                          "--host-discovery-script", "d.sh", "--slots-per-host", "2",
                          "--elastic-timeout", "60", "--reset-limit", "3",
                          "--blacklist-cooldown-range", "10", "20"])
    assert dict(args.elastic) == {
        "min_np": 2, "max_np": 4, "host_discovery_script": "d.sh", "slots_per_host": 2,
        "elastic_timeout": 60, "reset_limit": 3, "blacklist_cooldown_range": (10, 20)}
    assert dtlaunch_args(["--tcp"]).elastic == ()


def test_mpi_is_accepted_and_excluded_flags_give_way() -> None:
    assert dtlaunch_env(["--mpi", "--tcp"]) == {"NCCL_IB_DISABLE": "1"}
    names = {f for o in horovod_options(exclude_flags=("--min-np",)) for f in o.flags}
    assert "--min-np" not in names and "--min-num-proc" in names
    assert all(o.kind != SAME for o in horovod_options())


def test_launch_options_and_aliases() -> None:
    args = dtlaunch_args(["--network-interface", "eth0", "--network-interface", "ib0,eth0",
                          "--network-interfaces", "eth1", "--output-filename", "logs",
                          "-cb", "--disable-cache", "--start-timeout", "45",
                          "--binding-args", "-bind-to core -map-by slot", "-prefix-timestamp",
                          "--timeline", "t.json"])
    assert sorted(args.network_interfaces) == ["eth0", "eth1", "ib0"]  # a union, as horovodrun
    assert args.output_filename == "logs" and args.check_build and args.disable_cache
    assert args.start_timeout == 45 and args.prefix_timestamp
    assert args.binding_args == ("-bind-to", "core", "-map-by", "slot")
    assert dict(args.env) == {"HOROVOD_TIMELINE": "t.json"}


# --- the config file ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ("params:\n  fusion_threshold_mb: [1\n", r"horovod.yaml:3:1: malformed YAML"),
    ("params: {a: 1\n", r"horovod.yaml:2:1: malformed YAML"),
    ("params:\n\tcycle_time_ms: 1\n", r"horovod.yaml:2:1: malformed YAML"),
    ("params:\n  fusion_threshold_mb: 1.5\n", r":2:24: params.fusion_threshold_mb: expected a whole number, got 1.5"),
    ("params:\n  hierarchical_allreduce: 'yes please'\n", r"params.hierarchical_allreduce: expected true or false"),
    ("params:\n  cache_capacity: true\n", r"expected a whole number, got True"),
    ("params:\n  cycle_time_ms: '5'\n", r"expected a number, got '5'"),
    ("params:\n  cycle_time_ms: .nan\n", r"expected a number"),
    ("autotune:\n  enabled: null\n", r"autotune.enabled: expected true or false"),
    ("autotune:\n  gaussian_process_noise: 2\n", r"must be at most 1, got 2"),
    ("logging:\n  level: loud\n", r"expected one of TRACE"),
    ("timeline:\n  filename: 42\n", r"timeline.filename: expected a string"),
    ("params: 5\n", r":1:9: params: expected keys and values"),
    ("- params\n", r":1:1: expected horovodrun's sections"),
    ("controller: jsrun\n", r"controller: expected mpi or gloo, got 'jsrun'"),
    ("a: 1\n---\nb: 2\n", r"malformed YAML: expected a single document in the stream, but found another document"),
    ("params:\n  ? [a]\n  : 1\n", r"expected a key name in params"),
    ("params:\n  cycle_time_ms: !!python/name:os.system\n", r":2:18: malformed YAML: could not determine a constructor"),
])
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    # What horovodrun takes without a word is a warning instead: test_horovod_config_files.
    path = write(tmp_path, text)
    with pytest.raises(UsageError, match=message) as info:
        parse_horovod_args({}, read_horovod_config(path))
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_config_file_read_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        read_horovod_config(str(tmp_path / "missing.yaml"))
    (tmp_path / "bin.yaml").write_bytes(b"params:\n  x: \xff\n")
    with pytest.raises(UsageError, match=r"bin.yaml:2: not valid UTF-8"):
        read_horovod_config(str(tmp_path / "bin.yaml"))


def test_gloo_in_the_file_gives_way_to_the_mpi_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: gloo\nparams:\n  cache_capacity: 7\n")
    assert dtlaunch_env(["--mpi", "--config-file", path]) == {"HOROVOD_CACHE_CAPACITY": "7"}
    assert dtlaunch_args(["--mpi", "--config-file", path]).warnings == ()
    assert dtlaunch_args(["--mpi", "--config-file", path]).controller == "mpi"


def test_gloo_from_the_flag_or_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "controller: gloo\n")
    assert dtlaunch_args(["--config-file", path]).controller == "gloo"
    assert dtlaunch_args(["--config-file", path]).warnings == ()
    assert dtlaunch_args(["--gloo"]).controller == "gloo"
    assert dtlaunch_args([]).controller == "mpi"
    with pytest.raises(UsageError, match="expected mpi or gloo"):
        dtlaunch_args(["--config-file", write(tmp_path, "controller: nccl\n")])


def test_empty_sections_and_files_set_nothing() -> None:
    for text in ("", "# nothing\n", "params:\n", "params: {}\nautotune: {}\n", "controller:\n"):
        config = parse_horovod_config(text)
        assert config.values == () and config.controller is None
        assert parse_horovod_args({}, config).env == ()


def test_yaml_spellings_of_booleans_and_numbers() -> None:
    config = parse_horovod_config("params:\n  hierarchical_allreduce: yes\n  cache_capacity: 0x10\n"
                                  "  cycle_time_ms: 1_000\n")
    assert dict(config.values) == {"hierarchical_allreduce": True, "cache_capacity": 16,
                                   "cycle_time_ms": 1000}


# --- --check-build -------------------------------------------------------------------------------

@pytest.mark.parametrize("have", [set(), {"torch", "mpi", "gloo"}, {"tensorflow", "torch", "mxnet",
                                     "mpi", "gloo", "nccl", "ddl", "ccl"}])
def test_check_build_layout_matches_horovodrun(hvd_runner: None, capsys: pytest.CaptureFixture[str],
                                                have: set[str]) -> None:
    # horovodrun's own report, with its build probes answering from `have` (the real probes
    # import every framework in a subprocess: a minute and a half here).
    import horovod
    from horovod.runner import launch

    def built(name: str) -> Callable[..., bool]:
        return lambda verbose=False: name in have

    with mock.patch.object(launch, "extension_available", lambda n, verbose=False: n in have), \
            mock.patch.multiple(launch, **{f"{n}_built": built(n) for n in ("mpi", "gloo", "nccl", "ddl", "ccl")}), \
            pytest.raises(SystemExit):
        launch.check_build(verbose=False)
    theirs = capsys.readouterr().out.strip()
    names = {"tensorflow": "TensorFlow", "torch": "PyTorch", "mxnet": "MXNet", "mpi": "MPI",
             "gloo": "Gloo", "nccl": "NCCL", "ddl": "DDL", "ccl": "CCL"}
    found = [names[n] for n in have]
    ours = format_check_build(horovod.__version__, found, [n for n in found if n in ("MPI", "Gloo")],
                              found)
    assert ours == theirs


def test_the_guide_names_every_horovodrun_option() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "horovodrun.md").read_text()
    missing = [f for o in HOROVOD_OPTIONS for f in o.flags if f"`{f}" not in guide and f"{f}`" not in guide
               and f"/{f}" not in guide and f"{f}/" not in guide]
    assert missing == []
    for setting in SETTINGS:
        assert setting.env in guide


def test_the_options_fit_beside_dtlaunch_run_own() -> None:
    from dtlaunch.cli import run
    from dtlaunch.console.options import RUN_OWN_FLAGS

    own = {o for p in run.params if not (p.name or "").startswith("hvd_")
           for o in (*p.opts, *p.secondary_opts)}
    generated = {f for o in horovod_options() for f in o.flags}
    # dtlaunch's --timeline moves into the table; its own --min-np (restarts) replaces
    # horovodrun's elastic one, with the same meaning: fewest processes to go on with.
    assert own & generated <= {"--timeline", *RUN_OWN_FLAGS}
    for option in HOROVOD_OPTIONS:
        if option.kind in (SAME, "alias"):
            assert set(option.dtlaunch.split("/")) <= own, option
