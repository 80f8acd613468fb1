"""The doctor's report from every host's facts: each host judged by dtlaunch.check.host_checks against
this machine's own facts. Pure code."""

from __future__ import annotations

from collections.abc import Sequence

from dtlaunch.check.facts import HostFacts, PythonFacts, describe_gpus
from dtlaunch.check.gpus import check_gpus
from dtlaunch.check.host_checks import (
    Expectations,
    check_horovod,
    check_hostnames,
    check_iface,
    check_mpirun,
    check_pairwise,
    check_python,
    check_script,
    check_torch,
)
from dtlaunch.check.mpi_checks import check_horovod_mpi, check_mpi, host_daemon
from dtlaunch.check.report import (
    CHECK_NAMES,
    HOST,
    LOCAL,
    PASS,
    SKIP,
    CheckResult,
    DoctorReport,
    HostOutcome,
    HostReport,
    Role,
    unreachable,
)


def check_host(facts: HostFacts, role: Role, expect: Expectations, local: HostFacts | None,
               peers: Sequence[str] = (), path: str = "") -> tuple[CheckResult, ...]:
    local_mpi = local.mpi if local is not None else None
    local_py = local.python if local is not None else None
    python: tuple[CheckResult, ...]
    needs = expect.needs
    if expect.check_python:
        horovod = (CheckResult("horovod", SKIP, f"not needed ({needs.option})")
                   if needs.horovod is None else
                   check_horovod(facts.python, local_py, needs.horovod))
        if needs.mpi and needs.horovod is not None:  # Horovod must have linked the job's MPI
            horovod = check_horovod_mpi(horovod, facts.python, facts.mpi, str(facts.mpirun or ""))
        python = (check_python(facts.python, expect, local_py),
                  check_torch(facts.python, local_py), horovod)
    else:  # an executable that names no interpreter: nothing Python to check
        python = tuple(CheckResult(name, SKIP, "not a Python command")
                       for name in ("python", "torch", "horovod"))
    if not needs.mpi:
        mpi = tuple(CheckResult(name, SKIP, f"not needed ({needs.option})")
                    for name in ("mpirun", "mpi"))
    else:
        mpi = (check_mpirun(facts, role, needs_orted=bool(host_daemon(local_mpi))),
               check_mpi(facts, local_mpi))
    return (
        CheckResult("reach", PASS, "local" if role == LOCAL else (path or "ok")),
        *mpi,
        *python,
        check_script(facts, expect),
        check_iface(facts, expect.iface),
        check_pairwise(facts, expect, peers if role == HOST else ()),
    )


def versions_of(facts: HostFacts) -> tuple[tuple[str, str], ...]:
    py = facts.python
    pairs = [
        ("mpi", f"{facts.mpi.name} {facts.mpi.version}".strip() if facts.mpi else ""),
        ("python", py.version),
        ("torch", py.torch_imported or py.torch_version or ""),
        ("horovod", py.horovod_imported or py.horovod_version or ""),
    ]
    gpus = facts.gpus
    if gpus.smi:  # nothing about GPUs on hosts without nvidia-smi
        pairs += [("gpus", describe_gpus(gpus)), ("driver", gpus.driver or ""),
                  ("cuda", gpus.cuda or ""), ("nccl", nccl_of(py) if gpus.count else "")]
    return tuple((k, v or "") for k, v in pairs if v)


def nccl_of(py: PythonFacts) -> str:
    """The NCCL the ranks use: Horovod's own build when it has one, else PyTorch's."""
    return py.horovod_nccl or py.torch_nccl or ""


def gpu_checks(outcomes: Sequence[HostOutcome]) -> tuple[CheckResult, ...]:
    """The rank hosts' GPUs compared (dtlaunch.check.gpus.check_gpus); none where no rank host has
    nvidia-smi, so CPU-only clusters see nothing about GPUs."""
    rank = {o.host: o.facts for o in outcomes if o.facts is not None and o.is_rank_host}
    if not any(f.gpus.smi for f in rank.values()):
        return ()
    return check_gpus({h: f.gpus for h, f in rank.items()},
                      {h: f.python.torch_cuda for h, f in rank.items()},
                      {h: nccl_of(f.python) or None for h, f in rank.items()})


def evaluate(outcomes: Sequence[HostOutcome], expect: Expectations, seconds: float = 0.0,
             peers: Sequence[str] = ()) -> DoctorReport:
    """Every host's facts (or SSH problem) into the doctor's report."""
    local = next((o.facts for o in outcomes if o.role == LOCAL and o.facts), None)
    names = {o.host: o.facts.hostname for o in outcomes
             if o.facts is not None and o.is_rank_host}
    hostname_checks = check_hostnames(names)
    reports: list[HostReport] = []
    for outcome in outcomes:
        facts = outcome.facts
        hostname = facts.hostname if facts is not None else ""
        hostname_check = hostname_checks.get(
            outcome.host, CheckResult("hostname", SKIP, hostname or "not a rank host"))
        if facts is None:
            checks = (outcome.problem or unreachable("no answer", ""), *(
                hostname_check if name == "hostname" else CheckResult(name, SKIP, "not reached")
                for name in CHECK_NAMES[1:]))
            reports.append(HostReport(outcome.host, outcome.role, checks,
                                      seconds=outcome.seconds, note=outcome.note))
            continue
        checks = check_host(facts, outcome.role, expect, local,
                            [p for p in peers if p != outcome.host], outcome.path)
        cache = facts.python.import_cache_problem
        reports.append(HostReport(
            outcome.host, outcome.role, (*checks[:8], hostname_check, *checks[8:]),
            versions_of(facts), outcome.seconds, outcome.note, hostname, facts.gpus,
            (f"import cache not used: {cache}",) if cache else ()))
    reach = next((o.path for o in outcomes if o.path), "ssh")
    return DoctorReport(tuple(reports), seconds, reach=reach, job=gpu_checks(outcomes))
