"""How a kind of job starts and ends: the JobKind seam, and beside it the one registry that maps
a request to its kind.

A kind is one way the ranks of a job are started and meet: an MPI launcher (Open MPI's
mpirun, Hydra's mpiexec; over ssh or srun), Horovod's Gloo controller with dtlaunch's own
rendezvous, Horovod's elastic mode, and torch.distributed with torchrun's worker contract.
`run/` knows the seam only: it plans, checks the hosts, asks the request's kind for the job
(`JobKind.start`), runs what it returns and hands the result back to it (`StartedJob.finish`).
Each kind lives in its own folder and is named here by its module path, resolved on first use,
as a plugin registry is: adding a kind is a folder and one line of KINDS. What a kind adds to
the command line (its options of `dtlaunch run`, its flag of `dtlaunch doctor`, how its options
make a request its own) is data in its folder too (`KindOptions`), which the console declares.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from dtlaunch.check.network import NetworkChoice
    from dtlaunch.core.failure import Failure
    from dtlaunch.mpi import MpiFamily, MpiImpl
    from dtlaunch.plan.plan import RunPlan, RunRequest

# What a kind tells the run along the way, as the run's events say it (EventLevel's values).
SayLevel = Literal["note", "warning", "detail"]
Say = Callable[[SayLevel, str], None]


@dataclass(frozen=True)
class JobContext:
    """What a kind is given to start its job, once the job is planned and its hosts checked.

    The callbacks are the run's own services, so that no kind reaches above its floor: the
    pre-flight of a host that joins later (`admit`: None when it passed, else why not) and
    where the scheduler reaches nodes (`node_addresses`, inside a Slurm allocation)."""

    request: RunRequest  # hosts, -np and via (ssh or slurm) resolved; the network chosen
    plan: RunPlan
    program: str | None  # the local launcher's path (an MPI job's), else None
    network: NetworkChoice | None  # the pre-flight's choice of network, when it made one
    rank_program: tuple[str, ...]  # one rank's argv through the rank shim (PIPE_BUF records)
    python: str  # the interpreter the rank shim runs with on the hosts
    say: Say = lambda level, text: None
    admit: Callable[[str], str | None] = lambda host: None
    node_addresses: Callable[[Sequence[str]], Mapping[str, str]] = lambda hosts: {}
    attempt: int = 0  # 0 for the first run of a job, n for its n-th restart
    max_restarts: int = 0


@dataclass(frozen=True)
class JobEnd:
    """How the job's program ended, as the kind may restate it (an elastic job's driver knows
    which failures it recovered from)."""

    exit_code: int
    failure: Failure | None
    stopped: bool  # dtlaunch stopped it (a signal, --timeout): its word stands


@dataclass(frozen=True)
class StartedJob:
    """What runs (argv, its environment, its standard input), how its output and failures
    are read (`family`), and the kind's part of its end: a lost host handed to it instead of
    ending the job, what it closes when the job is over, and the result as the kind saw it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    family: MpiFamily
    stdin: bytes | Callable[[IO[bytes]], None] | None = None
    on_lost_host: Callable[[str], None] | None = None
    close: Callable[[], None] = lambda: None
    finish: Callable[[JobEnd], JobEnd] = lambda end: end


class JobKind(Protocol):
    """One way a job's ranks are started and meet."""

    name: str  # the registry's key

    def family(self, environ: Mapping[str, str]) -> tuple[MpiFamily, str | None, MpiImpl | None]:
        """Who starts the job, asked on this machine: (family, its program or None when it is
        not found, what the program says it is or None when not asked)."""

    def first_request(self, request: RunRequest, say: Say) -> RunRequest:
        """The request the job is planned for: as given, but for an elastic job's first hosts."""
        return request

    def start(self, context: JobContext) -> StartedJob:
        """Make the job ready to run (its rendezvous started); nothing of the user's runs yet."""


class OwnFanout(JobKind):
    """A kind whose ranks dtlaunch starts itself (its fan-out, no MPI launcher): its family
    (`FAMILY`) has no program to ask."""

    FAMILY: MpiFamily

    def family(self, environ: Mapping[str, str]) -> tuple[MpiFamily, str | None, MpiImpl | None]:
        from dtlaunch.mpi import MpiImpl

        return self.FAMILY, self.FAMILY.launcher, MpiImpl("none", "")


@dataclass(frozen=True)
class KindOption:
    """One of a kind's own options, as data: the console makes it a click option (click stays
    in the console), in the kind's section of `--help`."""

    names: tuple[str, ...]  # its spellings, the first shown: ("--nproc-per-node", ...)
    param: str  # the name its value is read by in `KindOptions.refine`
    help: str
    metavar: str | None = None
    type: type[str] | type[int] | None = str  # None: a flag (True when given)


@dataclass(frozen=True)
class KindOptions:
    """What a kind adds to the command line: its section of `dtlaunch run --help` with its
    options there, the `dtlaunch doctor` flag that checks the hosts for it, and `refine`, which
    makes a request the kind's own from the values of its options (by param; a flag not given
    is False, another option None) or raises UsageError for a bad one."""

    section: str = ""  # "": no section (the kind's options, if any, are declared elsewhere)
    run: tuple[KindOption, ...] = ()
    doctor: KindOption | None = None
    refine: Callable[[RunRequest, Mapping[str, Any]], RunRequest] = lambda request, values: request


@dataclass(frozen=True)
class Registered:
    """One kind in the registry: its JobKind, and its KindOptions when it adds options (both
    "module:object", imported when first asked for; the options' module is light, as the CLI
    imports it to declare them)."""

    kind: str
    options: str = ""


# The registry: a request's kind -> its implementation.
KINDS: dict[str, Registered] = {
    "mpi": Registered("dtlaunch.mpijob.launcher_choice:MPI_JOB"),
    "gloo": Registered("dtlaunch.gloo.kind:GLOO_JOB", "dtlaunch.gloo.options:OPTIONS"),
    "elastic": Registered("dtlaunch.elastic.kind:ELASTIC_JOB"),
    "torch": Registered("dtlaunch.torchrun.kind:TORCH_JOB", "dtlaunch.torchrun.options:OPTIONS"),
}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def kind_named(name: str) -> JobKind:
    kind: JobKind = _load(KINDS[name].kind)
    return kind


def kind_for(request: RunRequest) -> JobKind:
    """Which kind runs `request`: Horovod's elastic mode, else its `controller`."""
    return kind_named("elastic" if request.elastic is not None else request.controller)


def kind_options() -> dict[str, KindOptions]:
    """Each kind's options, by the kind's name, for those that add any (registry order)."""
    return {name: _load(entry.options) for name, entry in KINDS.items() if entry.options}
