"""What an elastic job asks for: horovodrun's elastic options, read and checked. Pure.

An elastic job (Horovod's `hvd.elastic.run`) runs on the hosts a discovery script lists at each
moment (or on fixed `-H` hosts with `--min-np`), between `--min-np` and `--max-np` processes; it
always uses Horovod's Gloo controller.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtlaunch.core.errors import UsageError
from dtlaunch.job.hosts import MAX_NUM_PROC, MAX_SLOTS

ELASTIC_TIMEOUT = 600.0  # horovodrun's default: how long to wait for --min-np slots
DISCOVERY_TIMEOUT = 30.0  # one run of the discovery script
COOLDOWN_LIMITS = (1, 3600)  # horovodrun's bounds for --blacklist-cooldown-range


@dataclass(frozen=True)
class ElasticSpec:
    min_np: int
    max_np: int | None = None
    num_proc: int | None = None  # -np: the size to start with (default: --min-np)
    discovery_script: str | None = None  # None: the fixed -H hosts
    slots_per_host: int | None = None
    timeout: float = ELASTIC_TIMEOUT
    reset_limit: int | None = None
    cooldown: tuple[int, int] | None = None

    @property
    def start_np(self) -> int:
        return self.num_proc if self.num_proc is not None else self.min_np


def elastic_spec(min_np: int | None, max_np: int | None, num_proc: int | None,
                 discovery_script: str | None, slots_per_host: int | None,
                 timeout: float | None, reset_limit: int | None,
                 cooldown: tuple[int, int] | None, has_hosts: bool) -> ElasticSpec:
    """The options as typed, checked as horovodrun checks them (and a little more)."""
    if discovery_script is None and not has_hosts:
        raise UsageError("elastic mode needs --host-discovery-script SCRIPT (or -H hosts with "
                         "--min-np)")
    if discovery_script is not None and has_hosts:
        raise UsageError("--host-discovery-script and -H/--hostfile cannot be combined: the "
                         "script lists the hosts")
    # Each size on its own first: --max-np 0 is that, not a missing --min-np.
    for name, value in (("--min-np", min_np), ("--max-np", max_np), ("-np", num_proc),
                        ("--slots-per-host", slots_per_host)):
        if value is not None and value < 1:
            raise UsageError(f"{name}: must be at least 1, got {value}")
        slots = name == "--slots-per-host"
        limit = MAX_SLOTS if slots else MAX_NUM_PROC
        if value is not None and value > limit:
            raise UsageError(f"{name}: {value} {'slots' if slots else 'processes'} is more than "
                             f"the {limit} dtlaunch {'accepts' if slots else 'starts'}")
    low = min_np if min_np is not None else num_proc
    if low is None:
        raise UsageError("elastic mode needs --min-np N (or -np N) to know how many processes "
                         "it may run on")
    if max_np is not None and max_np < low:
        raise UsageError(f"--max-np {max_np} is less than --min-np {low}")
    if num_proc is not None and (num_proc < low or (max_np is not None and num_proc > max_np)):
        raise UsageError(f"-np {num_proc} must be between --min-np {low} and --max-np "
                         f"{max_np if max_np is not None else 'unbounded'}")
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--elastic-timeout: must be more than 0 seconds, got {timeout:g}")
    if reset_limit is not None and reset_limit < 0:
        raise UsageError(f"--reset-limit: must be 0 or more, got {reset_limit}")
    if cooldown is not None:
        lower, upper = cooldown
        if not COOLDOWN_LIMITS[0] <= lower <= upper <= COOLDOWN_LIMITS[1]:
            raise UsageError(f"--blacklist-cooldown-range {lower} {upper}: need "
                             f"{COOLDOWN_LIMITS[0]} <= LOWER <= UPPER <= {COOLDOWN_LIMITS[1]} "
                             "seconds")
    return ElasticSpec(min_np=low, max_np=max_np, num_proc=num_proc,
                       discovery_script=discovery_script, slots_per_host=slots_per_host,
                       timeout=timeout if timeout is not None else ELASTIC_TIMEOUT,
                       reset_limit=reset_limit, cooldown=cooldown)
