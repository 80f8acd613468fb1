"""`dtlaunch env-check`: what this machine has, and what to fix before launching from it.

`gather_env` collects facts (side effects: subprocesses, file reads); `evaluate_env` is pure and
turns them into items with a status and a fix.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dtlaunch import __version__
from dtlaunch.check.facts import HostFacts
from dtlaunch.check.gpus import check_gpus
from dtlaunch.check.host_checks import UNROUTABLE_PREFIXES, check_horovod, check_mpirun, check_torch
from dtlaunch.check.mpi_checks import check_mpi
from dtlaunch.check.report import FAIL, LOCAL, PASS, WARN, CheckResult, Status
from dtlaunch.check.verdict import nccl_of
from dtlaunch.core.bounded import run_bounded
from dtlaunch.core.mpi_kinds import PREFERRED_MPI
from dtlaunch.job.env import looks_secret
from dtlaunch.openmpi.mca import (
    foreign_plm_choice,
    param_files_choose_plm,
    unusable_param_files,
)

STEERING_PREFIXES = ("OMPI_", "OPAL_", "PMIX_", "PRTE_", "ORTE_", "NCCL_", "HOROVOD_", "GLOO_",
                     "UCX_", "I_MPI_", "MPICH_", "TORCH_")
STEERING_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT",
                  "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")


@dataclass(frozen=True)
class EnvItem:
    """One row of env-check: a check result under a section."""

    section: str
    check: CheckResult

    def to_dict(self) -> dict[str, str]:
        c = self.check
        return {"section": self.section, "name": c.name, "value": c.detail, "status": c.status,
                "hint": c.hint}


def _run(argv: list[str], timeout: float = 20.0) -> tuple[int, str]:
    try:
        return run_bounded(argv, timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)


def _mca_components(ompi_info: str) -> dict[str, list[str]]:
    """framework -> component names (btl: [self, tcp, vader]), from `ompi_info --parsable`;
    none when it fails."""
    code, text = _run([ompi_info, "--parsable"])
    components: dict[str, list[str]] = {}
    for line in text.splitlines() if code == 0 else ():
        match = re.match(r"^mca:([a-z_]+):([A-Za-z0-9_]+):version:", line)
        if match:
            names = components.setdefault(match.group(1), [])
            if match.group(2) not in names:
                names.append(match.group(2))
    return components


def gather_env(python: str | None = None) -> tuple[dict[str, Any], HostFacts]:
    """This machine's facts: a JSON-ready document, and the probe's facts the checks judge.
    ``python``: the interpreter whose packages the probe reports (default: dtlaunch's own)."""
    from dtlaunch.probe.command import ProbeArgs, probe_local

    environ = dict(os.environ)
    facts: dict[str, Any] = {}
    uname = platform.uname()
    distro = ""
    with contextlib.suppress(OSError), open("/etc/os-release") as handle:
        distro = next((line.split("=", 1)[1].strip().strip('"') for line in handle
                       if line.startswith("PRETTY_NAME=")), "")
    facts["os"] = {"system": uname.system, "kernel": uname.release, "machine": uname.machine,
                   "distribution": distro, "hostname": uname.node}
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    facts["python"] = {"executable": sys.executable, "version": platform.python_version(),
                       "venv": sys.prefix if in_venv else None,
                       "conda": environ.get("CONDA_PREFIX")}
    facts["dtlaunch"] = {"version": __version__}
    host = probe_local(ProbeArgs(python=python or sys.executable, cwd=os.getcwd()))
    mpirun = host.mpirun
    ompi: dict[str, Any] = {"mpirun": mpirun, "orted": host.orted,
                            "implementation": host.mpi.name if host.mpi else None,
                            "version": host.mpi.version if host.mpi else None}
    # The tool describes its own MPI only (the PATH may hold one beside another MPI's mpirun).
    tool = host.mpi.kind.info_tool if host.mpi and host.mpi.kind else ""
    ompi_info = shutil.which(tool) if tool else None
    if mpirun and ompi_info:
        components = _mca_components(ompi_info)
        btl = components.get("btl", [])
        ompi.update({"ompi_info": ompi_info, "btl": btl, "pml": components.get("pml", []),
                     "tcp": "tcp" in btl, "shared_memory": any(c in btl for c in ("vader", "sm"))})
    # Open MPI's parameter files that choose a plm for one machine (plm = isolated). Only
    # Open MPI reads them (they live in ~/.openmpi, ~/.prte and its prefix's etc/), so whatever
    # the MPI first on PATH, a line there is about an Open MPI's mpirun typed by hand.
    ompi["launcher_set_in"] = list(param_files_choose_plm(mpirun)) if mpirun else []
    ompi["unusable_files"] = unusable_param_files(mpirun or "")
    facts["openmpi"] = ompi
    py = host.python
    facts["horovod"] = {"version": py.horovod_imported or py.horovod_version,
                        "frameworks": list(py.frameworks), "controllers": list(py.controllers),
                        "tensor_ops": list(py.tensor_ops), "error": py.horovod_error or None}
    facts["torch"] = {"version": py.torch_imported or py.torch_version, "cuda": py.torch_cuda,
                      "nccl": py.torch_nccl, "error": py.torch_error or None}
    gpus = host.gpus  # from the probe, with its deadline on nvidia-smi
    facts["gpus"] = {"nvidia_smi": shutil.which("nvidia-smi"),
                     "devices": [f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in gpus.gpus],
                     "device_files": sorted(glob.glob("/dev/nvidia[0-9]*")),
                     "count": gpus.count, "driver": gpus.driver, "cuda": gpus.cuda,
                     "nccl": nccl_of(py) if gpus.count else None,
                     "error": gpus.error or None, "note": gpus.note or None}
    import psutil

    facts["cpu"] = {"logical_cores": os.cpu_count(), "physical_cores": psutil.cpu_count(logical=False),
                    "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count()}
    memory = psutil.virtual_memory()
    facts["memory"] = {"total_bytes": memory.total, "available_bytes": memory.available}
    facts["interfaces"] = [{"name": i.name, "up": i.up, "addresses": list(i.addresses),
                            "likely_unroutable": i.name.startswith(UNROUTABLE_PREFIXES)}
                           for i in host.ifaces or ()]
    ssh = shutil.which("ssh")
    ssh_version = _run([ssh, "-V"], timeout=5)[1].strip() if ssh else None
    home = os.path.expanduser("~/.ssh")
    keys = sorted(p for p in glob.glob(os.path.join(home, "id_*")) if not p.endswith(".pub"))
    config = os.path.join(home, "config")
    facts["ssh"] = {"client": ssh, "version": ssh_version, "keys": keys,
                    "agent": bool(environ.get("SSH_AUTH_SOCK")),
                    "config": config if os.path.isfile(config) else None,
                    "known_hosts": os.path.isfile(os.path.join(home, "known_hosts"))}
    # Variables that steer MPI, NCCL and Horovod; values of secret-looking names are hidden.
    facts["environment"] = {name: "<hidden>" if looks_secret(name) else environ[name]
                            for name in sorted(environ)
                            if name.startswith(STEERING_PREFIXES) or name in STEERING_NAMES}
    return facts, host


def _judged(section: str, failing_name: str, check: CheckResult,
            info: Sequence[tuple[str, str]]) -> list[EnvItem]:
    """The doctor's verdict on this machine: one row with its fix when it fails, else the
    facts behind it as rows."""
    if check.status == FAIL:
        return [EnvItem(section, CheckResult(failing_name, FAIL, check.detail, check.hint))]
    return [EnvItem(section, CheckResult(name, PASS, value)) for name, value in info]


def evaluate_env(facts: Mapping[str, Any], host: HostFacts) -> tuple[EnvItem, ...]:
    """Facts -> report lines, each problem with its fix. Open MPI, torch and Horovod are
    judged by the doctor's checks (dtlaunch.check.host_checks) on this machine's own facts. Pure."""
    items: list[EnvItem] = []

    def add(section: str, name: str, value: str, ok: object = True, hint: str = "",
            bad: Status = WARN) -> None:
        """A row that passes, or has status `bad` and its fix `hint` when not `ok`."""
        items.append(EnvItem(section, CheckResult(name, PASS if ok else bad, value,
                                                  "" if ok else hint)))

    osf = facts["os"]
    add("os", "system", f"{osf['distribution'] or osf['system']} ({osf['machine']})")
    add("os", "kernel", osf["kernel"])
    py = facts["python"]
    add("python", "interpreter", f"{py['version']} {py['executable']}")
    env = py["venv"] or py["conda"]
    add("python", "environment", env or "system interpreter (no venv)", env,
        "use a virtual environment at the same path on every host, so '--python' names the "
        "same interpreter and packages everywhere")
    add("dtlaunch", "version", facts["dtlaunch"]["version"])
    mpi = facts["openmpi"]
    items += _judged("mpi", "mpirun", check_mpirun(host, LOCAL),
                     [("mpirun", str(mpi["mpirun"]))])
    if mpi["mpirun"]:
        # The implementation is named when it is not the one dtlaunch assumes.
        shown = [("implementation", mpi.get("implementation") or ""),
                 ("version", mpi.get("version") or "")]
        if mpi.get("implementation") in (None, PREFERRED_MPI):
            shown = shown[1:]
        items += _judged("mpi", "version", check_mpi(host, None), shown)
        if "btl" in mpi:
            add("mpi", "btl components", ",".join(mpi["btl"]) or "none")
            tcp, shared = mpi["tcp"], mpi["shared_memory"]
            add("mpi", "tcp", "yes" if tcp else "missing", tcp,
                "the TCP BTL is needed between hosts: reinstall Open MPI with its TCP component",
                FAIL)
            add("mpi", "shared memory", "yes" if shared else "missing", shared,
                "ranks on one host will talk over TCP (slower); install Open MPI's vader/sm "
                "component")
    hvd = facts["horovod"]
    items += _judged("horovod", "import", check_horovod(host.python, None), [
        ("version", str(hvd["version"])),
        ("frameworks", ", ".join(hvd["frameworks"]) or "none"),
        ("controllers", ", ".join(hvd["controllers"]) or "none"),
        ("tensor operations", ", ".join(hvd["tensor_ops"]) or "none")])
    torch = facts["torch"]
    items += _judged("torch", "import", check_torch(host.python, None), [
        ("version", str(torch["version"])), ("cuda", torch["cuda"] or "none (CPU build)"),
        ("nccl", torch["nccl"] or "none")])
    # A failing or hung nvidia-smi and a PyTorch built for a newer CUDA than the driver's get
    # their fix. No nvidia-smi: only `none found`.
    gpus, found = facts["gpus"], host.gpus
    add("gpus", "devices", "; ".join(gpus["devices"])
        or "none found" + (f" ({found.note})" if found.note else ""))
    if found.count:
        for name in ("driver", "cuda", "nccl"):
            add("gpus", name, str(gpus[name] or "unknown"))
    for check in check_gpus({"here": found}, {"here": host.python.torch_cuda}):
        if check.status in (FAIL, WARN):
            items.append(EnvItem("gpus", CheckResult(
                "nvidia-smi" if found.error else "cuda", check.status,
                check.detail.removeprefix("here: "), check.hint)))
    cpu = facts["cpu"]
    add("cpu", "cores", f"{cpu['usable_cores']} usable, {cpu['logical_cores']} logical"
        + (f", {cpu['physical_cores']} physical" if cpu["physical_cores"] else ""))
    memory = facts["memory"]
    add("memory", "total", f"{memory['total_bytes'] / 2**30:.1f} GiB "
        f"({memory['available_bytes'] / 2**30:.1f} GiB available)")
    for iface in facts["interfaces"]:
        addresses = ", ".join(iface["addresses"]) or "no address"
        note = " (likely unroutable)" if iface["likely_unroutable"] else ""
        add("network", iface["name"], f"{'up' if iface['up'] else 'down'}; {addresses}{note}")
    if not any(i["up"] and not i["likely_unroutable"] and any("." in a for a in i["addresses"])
               for i in facts["interfaces"]):
        add("network", "routable", "no interface up with an IPv4 address besides "
            "loopback/bridges", False, "connect a network, or launch on this host only")
    ssh = facts["ssh"]
    add("ssh", "client", f"{ssh['client']} ({ssh['version']})" if ssh["client"] else "not found",
        ssh["client"], "install the OpenSSH client: 'apt-get install openssh-client'", FAIL)
    if ssh["keys"] or ssh["agent"]:
        add("ssh", "keys", ", ".join(ssh["keys"]) + (" + agent" if ssh["agent"] else ""))
    else:
        add("ssh", "keys", "no key in ~/.ssh and no agent", False,
            "create one with 'ssh-keygen -t ed25519' and install it on every host with "
            "'ssh-copy-id HOST'")
    stray = foreign_plm_choice(facts["environment"])
    for name, value in facts["environment"].items():
        # Stray: an image's default for one machine (docs/run.md, "At scale").
        add("environment", name, value, name not in stray, "a hand-typed mpirun across hosts "
            "would run every rank here with it: unset it (dtlaunch run leaves it out for a job "
            "across hosts)")
    for where in facts["openmpi"].get("launcher_set_in", ()):
        add("environment", "parameter file", where, False,
            "a hand-typed mpirun across hosts fails with it: remove the line (dtlaunch run "
            "names ssh's launcher on mpirun's command line for a job across hosts)")
    for problem in facts["openmpi"].get("unusable_files", ()):
        add("environment", "parameter file", problem, False,
            "mpirun would hang on it or stop without saying why, and dtlaunch run refuses it: "
            "remove it or make it a regular file")
    return tuple(items)


@dataclass(frozen=True)
class EnvReport:
    """env-check's outcome: what was gathered (as `--json` shows it) and each row judged."""

    facts: Mapping[str, Any]
    items: tuple[EnvItem, ...]

    @property
    def ok(self) -> bool:
        return all(i.check.status != FAIL for i in self.items)


def check_env() -> EnvReport:
    """This machine gathered and judged: env-check's one library call."""
    facts, host = gather_env()
    return EnvReport(facts, evaluate_env(facts, host))
