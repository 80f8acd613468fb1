"""Horovod's knobs: horovodrun's names, types, config-file keys and the variables they set. Pure.

One `Setting` per knob, in the order horovodrun's `config_parser.set_env_from_args` sets them,
which is the order of the variables; `build_horovod_env` turns final values into variables the
way that function does (gates, 1/0 encodings, MiB to bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dtlaunch.core.errors import UsageError

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

# Horovod reads its whole-number variables into a C int: more would wrap around there.
C_INT_MAX = 2**31 - 1
# A year and a day, as for dtlaunch's own seconds (console.options.MAX_SECONDS; horovod/ sits below console/).
MAX_SECONDS = 366 * 86400


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# Value types (of a Setting, or of what an option takes).
INT, FLOAT, STR, BOOL, LEVEL = "int", "float", "str", "bool", "level"


@dataclass(frozen=True)
class Setting:
    """One Horovod knob: horovodrun's argparse dest, the variable and the config-file key."""

    dest: str
    type: str
    env: str
    section: str | None  # config-file section (None: flag only)
    key: str | None
    minimum: float | None = None
    maximum: float | None = None
    encode: str = "plain"  # how the value becomes the variable: a key of ENCODINGS
    unit: str = ""  # after the maximum in an error line: " (1 TiB)"

    def check(self, value: Any, where: str) -> Any:
        """The value, or a UsageError naming `where` (a flag or a config-file position)."""
        kind = type(value)
        if self.type == BOOL and kind is not bool:
            raise UsageError(f"{where}: expected true or false, got {value!r}")
        if self.type == INT and kind is not int:
            raise UsageError(f"{where}: expected a whole number, got {value!r}")
        if self.type == FLOAT and (kind not in (int, float) or not math.isfinite(value)):
            raise UsageError(f"{where}: expected a number, got {value!r}")
        if self.type in (STR, LEVEL) and kind is not str:
            raise UsageError(f"{where}: expected a string, got {value!r}")
        if self.type == LEVEL and value.upper() not in LOG_LEVELS:
            raise UsageError(f"{where}: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{where}: must be >= {_number(self.minimum)}, got {value!r}")
        maximum = self.maximum if self.maximum is not None else (
            C_INT_MAX if self.type == INT else None)
        if maximum is not None and value > maximum:
            raise UsageError(f"{where}: must be at most {_number(maximum)}{self.unit}, "
                             f"got {value!r}")
        return value


# A knob's value as its variable: plain str(), 1/0, 0/1, MiB -> bytes, "1" or unset.
ENCODINGS: dict[str, Callable[[Any], str | None]] = {
    "plain": str, "bool": lambda v: "1" if v else "0", "inverse": lambda v: "0" if v else "1",
    "mebibytes": lambda v: str(v * 1024 * 1024), "true_only": lambda v: "1" if v else None}


def _s(dest: str, type_: str, env: str, section: str | None, key: str | None = None,
       **kw: Any) -> Setting:
    return Setting(dest, type_, env, section, key if key is not None else dest, **kw)


# In horovodrun's order (set_env_from_args), which is the order of the variables.
SETTINGS: tuple[Setting, ...] = (
    # Bounded like -np: far past any real use, a typo rather than a setting.
    _s("fusion_threshold_mb", INT, "HOROVOD_FUSION_THRESHOLD", "params", minimum=0,
       maximum=1 << 20, unit=" MiB (1 TiB)", encode="mebibytes"),
    _s("cycle_time_ms", FLOAT, "HOROVOD_CYCLE_TIME", "params", minimum=0, maximum=3_600_000,
       unit=" ms (an hour)"),
    _s("cache_capacity", INT, "HOROVOD_CACHE_CAPACITY", "params", minimum=0,
       maximum=10_000_000),
    _s("hierarchical_allreduce", BOOL, "HOROVOD_HIERARCHICAL_ALLREDUCE", "params", encode="bool"),
    _s("hierarchical_allgather", BOOL, "HOROVOD_HIERARCHICAL_ALLGATHER", "params", encode="bool"),
    _s("torus_allreduce", BOOL, "HOROVOD_TORUS_ALLREDUCE", "params", encode="bool"),
    _s("autotune", BOOL, "HOROVOD_AUTOTUNE", "autotune", "enabled", encode="bool"),
    _s("autotune_log_file", STR, "HOROVOD_AUTOTUNE_LOG", "autotune", "log_file"),
    _s("autotune_warmup_samples", INT, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "autotune",
       "warmup_samples", minimum=0),
    _s("autotune_steps_per_sample", INT, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "autotune",
       "steps_per_sample", minimum=0),
    _s("autotune_bayes_opt_max_samples", INT, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "autotune",
       "bayes_opt_max_samples", minimum=0),
    _s("autotune_gaussian_process_noise", FLOAT, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
       "autotune", "gaussian_process_noise", minimum=0, maximum=1),
    _s("timeline_filename", STR, "HOROVOD_TIMELINE", "timeline", "filename"),
    _s("timeline_mark_cycles", BOOL, "HOROVOD_TIMELINE_MARK_CYCLES", "timeline", "mark_cycles",
       encode="bool"),
    # The file says `enabled`; the knob is its negation (see horovod_config).
    _s("no_stall_check", BOOL, "HOROVOD_STALL_CHECK_DISABLE", "stall_check", "enabled",
       encode="bool"),
    _s("stall_check_warning_time_seconds", INT, "HOROVOD_STALL_CHECK_TIME_SECONDS", "stall_check",
       "warning_time_seconds", minimum=0, maximum=MAX_SECONDS, unit=" s (a year and a day)"),
    _s("stall_check_shutdown_time_seconds", INT, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
       "stall_check", "shutdown_time_seconds", minimum=0, maximum=MAX_SECONDS,
       unit=" s (a year and a day)"),
    _s("mpi_threads_disable", BOOL, "HOROVOD_MPI_THREADS_DISABLE", "library_options",
       encode="bool"),
    _s("num_nccl_streams", INT, "HOROVOD_NUM_NCCL_STREAMS", "library_options", minimum=0,
       maximum=1024),
    _s("tcp_flag", BOOL, "NCCL_IB_DISABLE", None, None, encode="true_only"),
    _s("thread_affinity", INT, "HOROVOD_THREAD_AFFINITY", "library_options", minimum=0),
    _s("gloo_timeout_seconds", INT, "HOROVOD_GLOO_TIMEOUT_SECONDS", "library_options", minimum=0,
       maximum=MAX_SECONDS, unit=" s (a year and a day)"),
    _s("log_level", LEVEL, "HOROVOD_LOG_LEVEL", "logging", "level"),
    _s("log_with_timestamp", BOOL, "HOROVOD_LOG_HIDE_TIME", "logging", "with_timestamp",
       encode="inverse"),
)
SETTING_BY_DEST = {s.dest: s for s in SETTINGS}
# Variables set only when their group is switched on (horovodrun's rule).
_GATES = {**{d: "autotune" for d in ("autotune_log_file", "autotune_warmup_samples",
                                     "autotune_steps_per_sample", "autotune_bayes_opt_max_samples",
                                     "autotune_gaussian_process_noise")},
          "autotune": "autotune", "timeline_mark_cycles": "timeline_filename",
          "timeline_filename": "timeline_filename"}


def build_horovod_env(settings: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The variables for final knob values, exactly as horovodrun's set_env_from_args."""
    env: list[tuple[str, str]] = []
    for setting in SETTINGS:
        gate = _GATES.get(setting.dest)
        if gate is not None and not settings.get(gate):
            continue
        value = settings.get(setting.dest)
        variable = None if value is None else ENCODINGS[setting.encode](value)
        if variable is not None:
            env.append((setting.env, variable))
    return tuple(env)
