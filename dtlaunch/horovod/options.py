"""horovodrun's options as data, and the exact HOROVOD_* variables they set. Pure code.

`HOROVOD_OPTIONS` lists every option of horovodrun (Horovod 0.28.1) with what dtlaunch does with
it; the CLI declares one click option per entry (every entry `multiple`, so a repeat is caught
here rather than silently taking the last) and hands the parsed values, keyed by `param`, to
`parse_horovod_args`. The variables equal what horovodrun's own
`config_parser.set_env_from_args` sets for the same flags and config file (the tests compare
them with the installed Horovod over generated combinations).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dtlaunch.core.errors import UsageError
from dtlaunch.horovod.settings import (
    BOOL,
    FLOAT,
    INT,
    LEVEL,
    LOG_LEVELS,
    SETTING_BY_DEST,
    SETTINGS,
    STR,
    build_horovod_env,
)
from dtlaunch.job.binding import parse_binding_args

if TYPE_CHECKING:  # the file's reader is imported only when --config-file is given
    from dtlaunch.horovod.config_file import HorovodConfig

# What dtlaunch does with an option.
SETTING = "setting"  # sets a Horovod knob (a variable for the ranks)
LAUNCH = "launch"  # changes how dtlaunch launches; the CLI reads it from HorovodArgs
ALIAS = "alias"  # the same as an existing dtlaunch option (`dtlaunch` names it)
SAME = "same"  # dtlaunch's own option already has this meaning; add the spelling to it
NOOP = "noop"  # accepted, nothing to do
REFUSED = "refused"  # one line saying why and what to use instead


@dataclass(frozen=True)
class HorovodOption:
    """One horovodrun option. `param` is the click parameter name the CLI declares it under."""

    flags: tuple[str, ...]
    kind: str
    value: str = BOOL  # BOOL: a flag; INT/FLOAT/STR: takes a value
    dest: str | None = None  # SETTING: the Setting it sets; LAUNCH/ALIAS: the HorovodArgs field
    const: bool = True  # SETTING flags: the value they store
    nargs: int = 1
    metavar: str = ""
    help: str = ""
    hidden: bool = False
    repeatable: bool = False
    dtlaunch: str = ""  # ALIAS/SAME: the dtlaunch option with this meaning
    refusal: str = ""
    param: str = ""  # click parameter name; derived from the longest spelling when empty

    def __post_init__(self) -> None:
        if not self.param:
            longest = max(self.flags, key=len)
            object.__setattr__(self, "param", "hvd_" + longest.lstrip("-").replace("-", "_"))

    @property
    def name(self) -> str:
        return "/".join(self.flags)


def _v(flags: str, dest: str, type_: str, metavar: str, help_: str, **kw: Any) -> HorovodOption:
    return HorovodOption(tuple(flags.split()), SETTING, type_, dest, metavar=metavar, help=help_,
                         **kw)


def _f(flags: str, dest: str, const: bool, help_: str = "") -> HorovodOption:
    return HorovodOption(tuple(flags.split()), SETTING, BOOL, dest, const, help=help_,
                         hidden=not help_)


def _switch(dest: str, on: str, off: str, on_help: str = "",
            off_help: str = "") -> tuple[HorovodOption, HorovodOption]:
    """A knob's pair of flags: `on` stores True, `off` False (each hidden without a help)."""
    return _f(on, dest, True, on_help), _f(off, dest, False, off_help)


HOROVOD_OPTIONS: tuple[HorovodOption, ...] = (
    # Same meaning as a dtlaunch option: the CLI adds horovodrun's spelling to its own option.
    HorovodOption(("-np", "--num-proc"), SAME, INT, dtlaunch="-np/--num-proc"),
    HorovodOption(("-H", "--hosts"), SAME, STR, dtlaunch="-H/--hosts"),
    HorovodOption(("-hostfile", "--hostfile"), SAME, STR, dtlaunch="--hostfile"),
    HorovodOption(("-p", "--ssh-port"), SAME, INT, dtlaunch="--ssh-port"),
    HorovodOption(("-i", "--ssh-identity-file"), SAME, STR, dtlaunch="--ssh-identity-file"),
    HorovodOption(("--verbose",), SAME, BOOL, dtlaunch="-v/--verbose"),
    HorovodOption(("--mpi-args",), SAME, STR, dtlaunch="--mpi-args"),
    HorovodOption(("--network-interfaces",), ALIAS, STR, "network_interfaces", metavar="NICS",
                  repeatable=True, dtlaunch="--iface", help="Same as --iface (names, comma separated)."),
    HorovodOption(("--network-interface",), ALIAS, STR, "network_interfaces", metavar="NIC",
                  repeatable=True, dtlaunch="--iface", help="Same as --iface (repeatable)."),
    HorovodOption(("--output-filename",), ALIAS, STR, "output_filename", metavar="DIR",
                  dtlaunch="--output-dir", help="Same as --output-dir."),
    # How dtlaunch launches.
    HorovodOption(("-cb", "--check-build"), LAUNCH, BOOL, "check_build",
                  help="Show which frameworks, controllers and tensor operations Horovod has, and exit."),
    HorovodOption(("--disable-cache",), LAUNCH, BOOL, "disable_cache",
                  help="Run every pre-flight check, ignoring a recent cached success."),
    HorovodOption(("--start-timeout",), LAUNCH, INT, "start_timeout", metavar="SECONDS",
                  help="Seconds the pre-flight checks may take (horovodrun's default: 30)."),
    HorovodOption(("--config-file",), LAUNCH, STR, "config_file", metavar="FILE",
                  help="horovodrun's YAML file of Horovod parameters; flags beat the file."),
    HorovodOption(("--binding-args",), LAUNCH, STR, "binding_args", metavar="ARGS",
                  help="mpirun binding/mapping options instead of '-bind-to none -map-by slot'."),
    HorovodOption(("-prefix-timestamp", "--prefix-output-with-timestamp"), LAUNCH, BOOL,
                  "prefix_timestamp", help="Start each output line with the time."),
    HorovodOption(("--gloo",), LAUNCH, BOOL, "gloo",
                  help="Horovod's Gloo controller: no MPI; dtlaunch starts every rank over ssh "
                       "and runs the rendezvous (see docs/gloo.md)."),
    HorovodOption(("--mpi",), NOOP, BOOL, help="Horovod's MPI controller (the default).",
                  hidden=True),
    # Horovod's knobs: variables for the ranks.
    _v("--fusion-threshold-mb", "fusion_threshold_mb", INT, "MB",
       "Tensor fusion buffer in MB (0 disables fusion)."),
    _v("--cycle-time-ms", "cycle_time_ms", FLOAT, "MS", "Delay between tensor fusion cycles."),
    _v("--cache-capacity", "cache_capacity", INT, "N", "Response cache size (tensor names)."),
    *_switch("hierarchical_allreduce", "--hierarchical-allreduce", "--no-hierarchical-allreduce",
             "Hierarchical allreduce.", "Never hierarchical allreduce (autotune leaves it off)."),
    *_switch("hierarchical_allgather", "--hierarchical-allgather", "--no-hierarchical-allgather",
             "Hierarchical allgather.", "Never hierarchical allgather (autotune leaves it off)."),
    *_switch("torus_allreduce", "--torus-allreduce", "--no-torus-allreduce",
             "2D torus allreduce (NCCL).", "Never torus allreduce."),
    *_switch("autotune", "--autotune", "--no-autotune", "Tune the knobs above while training."),
    _v("--autotune-log-file", "autotune_log_file", STR, "FILE", "Autotune's trial log (CSV)."),
    _v("--autotune-warmup-samples", "autotune_warmup_samples", INT, "N",
       "Autotune samples discarded first."),
    _v("--autotune-steps-per-sample", "autotune_steps_per_sample", INT, "N",
       "Steps per autotune sample."),
    _v("--autotune-bayes-opt-max-samples", "autotune_bayes_opt_max_samples", INT, "N",
       "Samples per Bayesian optimisation."),
    _v("--autotune-gaussian-process-noise", "autotune_gaussian_process_noise", FLOAT, "X",
       "Noise regularisation in [0, 1]."),
    # `--timeline` is dtlaunch's older spelling of the same setting.
    _v("--timeline-filename --timeline", "timeline_filename", STR, "FILE",
       "Write a Horovod timeline to FILE."),
    *_switch("timeline_mark_cycles", "--timeline-mark-cycles", "--no-timeline-mark-cycles",
             "Mark fusion cycles on the timeline."),
    *_switch("no_stall_check", "--no-stall-check", "--stall-check", "Disable the stall check."),
    _v("--stall-check-warning-time-seconds", "stall_check_warning_time_seconds", INT, "S",
       "Seconds before a stall warning."),
    _v("--stall-check-shutdown-time-seconds", "stall_check_shutdown_time_seconds", INT, "S",
       "Seconds before a stalled job shuts down."),
    *_switch("mpi_threads_disable", "--mpi-threads-disable", "--no-mpi-threads-disable",
             "Disable MPI threading support."),
    _v("--num-nccl-streams", "num_nccl_streams", INT, "N", "NCCL streams."),
    _f("--tcp", "tcp_flag", True, "Keep NCCL off InfiniBand (NCCL_IB_DISABLE=1)."),
    _v("--thread-affinity", "thread_affinity", INT, "CORE", "Core of Horovod's background thread."),
    _v("--gloo-timeout-seconds", "gloo_timeout_seconds", INT, "S", "Timeout of Gloo operations."),
    _v("--log-level", "log_level", LEVEL, "LEVEL", "Horovod's log level: " + ", ".join(LOG_LEVELS) + "."),
    *_switch("log_with_timestamp", "--log-with-timestamp", "--log-without-timestamp",
             off_help="No time in Horovod's log lines."),
    # horovodrun's deprecated spellings of the same knob, the other way round.
    *_switch("log_with_timestamp", "--no-log-hide-timestamp", "--log-hide-timestamp"),
    # Not done by dtlaunch: refused with the reason.
    HorovodOption(("--jsrun",), REFUSED, BOOL, hidden=True, refusal="dtlaunch starts ranks with "
                  "mpirun over SSH, not with LSF's jsrun; drop --jsrun and give the hosts with -H "
                  "or --hostfile"),
    # Elastic mode (docs/elastic.md): dtlaunch's own --min-np is horovodrun's too.
    HorovodOption(("--min-np", "--min-num-proc"), LAUNCH, INT, "min_np", metavar="N",
                  hidden=True),
    HorovodOption(("--max-np", "--max-num-proc"), LAUNCH, INT, "max_np", metavar="N",
                  help="Elastic: most processes to run (default: every slot)."),
    HorovodOption(("--host-discovery-script",), LAUNCH, STR, "host_discovery_script",
                  metavar="SCRIPT", help="Elastic: a program that prints the hosts available "
                                         "now, HOST:SLOTS a line (see docs/elastic.md)."),
    HorovodOption(("--slots-per-host",), LAUNCH, INT, "slots_per_host", metavar="N",
                  help="Elastic: slots of a host the script prints without :SLOTS."),
    HorovodOption(("--elastic-timeout",), LAUNCH, INT, "elastic_timeout", metavar="SECONDS",
                  help="Elastic: how long to wait for --min-np slots (default 600)."),
    HorovodOption(("--reset-limit",), LAUNCH, INT, "reset_limit", metavar="N",
                  help="Elastic: most resets (host changes, failures) before the job stops."),
    HorovodOption(("--blacklist-cooldown-range",), LAUNCH, INT, "blacklist_cooldown_range",
                  nargs=2, metavar="LOW HIGH",
                  help="Elastic: a failed host may come back after a cooldown in this range "
                       "(seconds; default: never)."),
)


def horovod_options(exclude_flags: Collection[str] = ()) -> tuple[HorovodOption, ...]:
    """The options for the CLI to declare, without the spellings dtlaunch declares itself.

    SAME entries are left out (dtlaunch's own option carries them). `exclude_flags` drops
    spellings the CLI uses for its own options (e.g. a future `--min-np` for restarts)."""
    kept = ((o, tuple(f for f in o.flags if f not in exclude_flags)) for o in HOROVOD_OPTIONS)
    return tuple(replace(o, flags=flags) for o, flags in kept if o.kind != SAME and flags)


@dataclass(frozen=True)
class HorovodArgs:
    """What the horovodrun options and config file ask of dtlaunch."""

    env: tuple[tuple[str, str], ...] = ()  # variables for every rank, in horovodrun's order
    settings: tuple[tuple[str, Any], ...] = ()  # dest -> final value (flags beat the file)
    network_interfaces: tuple[str, ...] = ()  # for --iface (names, union, first-seen order)
    output_filename: str | None = None  # for --output-dir
    check_build: bool = False
    disable_cache: bool = False
    start_timeout: int | None = None
    config_file: str | None = None
    binding_args: tuple[str, ...] | None = None  # checked by dtlaunch.job.binding; replaces its default
    prefix_timestamp: bool = False
    warnings: tuple[str, ...] = ()  # one line each (the config file's keys horovodrun ignores)
    controller: str = "mpi"  # "gloo": --gloo, or `controller: gloo` in the file without --mpi
    elastic: tuple[tuple[str, Any], ...] = ()  # elastic mode's options as given (ELASTIC_DESTS)


ELASTIC_DESTS = ("min_np", "max_np", "host_discovery_script", "slots_per_host",
                 "elastic_timeout", "reset_limit", "blacklist_cooldown_range")


def _given(values: Mapping[str, Sequence[Any]], option: HorovodOption) -> tuple[Any, ...]:
    raw = values.get(option.param) or ()
    given = tuple(v for v in raw if v is not None and v is not False)
    if len(given) > 1 and not option.repeatable:
        raise UsageError(f"{option.name}: given more than once")
    return given


def parse_horovod_args(values: Mapping[str, Sequence[Any]],
                       config: HorovodConfig | None = None) -> HorovodArgs:
    """From the CLI's parsed values (param -> tuple of values) and a config file to HorovodArgs.

    A flag beats the config file, as in horovodrun; a refused option, a repeated option, two
    options that contradict each other and out-of-range values raise UsageError."""
    from_flags: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    launch: dict[str, Any] = {}
    nics: list[str] = []
    mpi_controller = False
    for option in HOROVOD_OPTIONS:
        given = () if option.kind == SAME else _given(values, option)
        if not given:
            continue
        flag = option.flags[0]
        if option.kind == REFUSED:
            raise UsageError(f"{option.name} {option.refusal}")
        if option.kind == NOOP:
            mpi_controller = True
        elif option.kind == SETTING and option.dest is not None:
            if option.dest in set_by:
                raise UsageError(f"{set_by[option.dest]} and {flag} contradict each other; give one")
            set_by[option.dest] = flag
            value = option.const if option.value == BOOL else given[0]
            from_flags[option.dest] = SETTING_BY_DEST[option.dest].check(value, flag)
        elif option.dest == "network_interfaces":
            for value in given:
                for name in (part.strip() for part in value.split(",")):
                    if not name:
                        raise UsageError(f"{flag}: empty interface name in {value!r}")
                    if name not in nics:
                        nics.append(name)
        elif option.dest is not None:
            launch[option.dest] = True if option.value == BOOL else given[0]
    merged: dict[str, Any] = {}
    warnings: list[str] = []
    if mpi_controller and launch.get("gloo"):
        raise UsageError("--mpi and --gloo contradict each other; give one")
    controller = "gloo" if launch.get("gloo") else "mpi"
    if config is not None:
        warnings += config.warnings
        if config.controller == "gloo" and not mpi_controller:
            controller = "gloo"  # a flag beats the file, as in horovodrun
        merged.update((d, v) for d, v in config.values if d not in from_flags)
    merged.update(from_flags)
    timeout = launch.get("start_timeout")
    if timeout is not None and not 1 <= timeout <= 86400:
        raise UsageError(f"--start-timeout: must be between 1 second and a day, got {timeout}")
    binding = launch.get("binding_args")
    if binding is not None:
        try:
            words = tuple(shlex.split(binding))
        except ValueError as exc:
            raise UsageError(f"--binding-args: cannot split {binding!r}: {exc}") from None
        binding = parse_binding_args(words)
    return HorovodArgs(
        env=build_horovod_env(merged),
        settings=tuple((s.dest, merged[s.dest]) for s in SETTINGS if s.dest in merged),
        network_interfaces=tuple(nics), output_filename=launch.get("output_filename"),
        check_build=bool(launch.get("check_build")), disable_cache=bool(launch.get("disable_cache")),
        start_timeout=timeout, config_file=launch.get("config_file"),
        binding_args=binding,
        prefix_timestamp=bool(launch.get("prefix_timestamp")),
        warnings=tuple(warnings), controller=controller,
        elastic=tuple((d, launch[d]) for d in ELASTIC_DESTS if d in launch))


def read_horovod_args(values: Mapping[str, Sequence[Any]]) -> HorovodArgs:
    """parse_horovod_args after reading `--config-file` when one is given (the only I/O here)."""
    paths = _given(values, next(o for o in HOROVOD_OPTIONS if o.dest == "config_file"))
    if not paths:
        return parse_horovod_args(values)
    from dtlaunch.horovod.config_file import read_horovod_config  # only for a file

    return parse_horovod_args(values, read_horovod_config(paths[0]))


def format_check_build(version: str, frameworks: Collection[str], controllers: Collection[str],
                       tensor_ops: Collection[str]) -> str:
    """`--check-build`'s report, laid out as horovodrun prints it."""

    def box(name: str, found: Collection[str]) -> str:
        return f"    [{'X' if name in found else ' '}] {name}"

    lines = [f"Horovod v{version}:", "", "Available Frameworks:"]
    lines += [box(n, frameworks) for n in ("TensorFlow", "PyTorch", "MXNet")]
    lines += ["", "Available Controllers:"] + [box(n, controllers) for n in ("MPI", "Gloo")]
    lines += ["", "Available Tensor Operations:"]
    lines += [box(n, tensor_ops) for n in ("NCCL", "DDL", "CCL", "MPI", "Gloo")]
    return "\n".join(lines)
