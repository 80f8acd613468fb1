"""Judge what the hosts reported: pure functions from facts to check results with fixes.

Every remote host is compared with this machine (the one running dtlaunch), because
Open MPI only works between identical versions and the ranks run the same interpreter path with
the same packages everywhere.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dtlaunch.check.facts import HostFacts, Iface, PythonFacts
from dtlaunch.check.report import FAIL, HOST, LOCAL, PASS, SKIP, WARN, CheckResult, Role
from dtlaunch.core.mpi_kinds import INSTALL_OMPI_HINT, HostNeeds
from dtlaunch.job.iface import Interfaces

UNROUTABLE_PREFIXES = ("lo", "docker", "virbr", "veth", "br-", "cni", "flannel", "tun", "tap")

INSTALL_HOROVOD_HINT = (
    "build Horovod with MPI for this interpreter: HOROVOD_WITH_MPI=1 HOROVOD_WITH_PYTORCH=1 "
    "pip install --no-build-isolation horovod (needs cmake, a C++ compiler, libopenmpi-dev and "
    "torch installed first)"
)


@dataclass(frozen=True)
class Expectations:
    """What the job needs from every host (from the doctor or run command line)."""

    python: str
    script: str | None = None  # absolute path
    module: str | None = None
    iface: Interfaces | None = None
    pairwise: bool = False
    check_python: bool = True  # False: the command names no interpreter
    # The executable the command starts (`bash`, `numactl`, `./train`) when it is not the
    # interpreter: a bare name is looked up on the PATH the job exports.
    program: str | None = None
    # What the way the job starts needs on every host (its MpiFamily's `needs`): the MPI
    # checks are skipped where no MPI runs, Horovod's where none is imported.
    needs: HostNeeds = field(default_factory=HostNeeds)


PATH_HINT = ("put Open MPI's bin directory on the PATH of a non-interactive login: set PATH in "
             "~/.bashrc ABOVE its 'If not running interactively' guard (or in /etc/environment), "
             "then check with 'ssh HOST command -v mpirun orted'")


# --- single checks ------------------------------------------------------------------------------


def check_mpirun(facts: HostFacts, role: Role, needs_orted: bool = True) -> CheckResult:
    """needs_orted: Open MPI's daemon on each host's PATH (Hydra starts its proxy by the
    launcher's path)."""
    if facts.mpi_launcher:
        return _check_launcher_path(facts, role)
    missing = [n for n, p in (("mpirun", facts.mpirun), ("orted", facts.orted))
               if p is None and (n == "mpirun" or (role == HOST and needs_orted))]
    if missing:
        names = " and ".join(missing)
        where = "this machine's PATH" if role == LOCAL else "the PATH of a non-interactive login"
        return CheckResult("mpirun", FAIL, f"{names} not found on {where} (PATH={facts.path})",
                           INSTALL_OMPI_HINT + "; " + PATH_HINT)
    return CheckResult("mpirun", PASS, str(facts.mpirun))


def _check_launcher_path(facts: HostFacts, role: Role) -> CheckResult:
    """mpirun started by its absolute path starts each host's daemon from the same prefix
    (as `--prefix` would), so a venv's or /opt's MPI must exist at that path on every host."""
    folder = facts.mpi_launcher.rsplit("/", 1)[0]
    if facts.mpirun is None:
        return CheckResult("mpirun", FAIL, f"{facts.mpi_launcher} not found on this host; the job "
                           "starts this machine's MPI from the same path on every host",
                           f"install the same MPI at {folder} on every host (or put it on a "
                           "filesystem every host mounts at the same path)")
    if role == HOST and facts.orted is None:
        return CheckResult("mpirun", FAIL, f"no orted, prted or hydra_pmi_proxy in {folder} on "
                           "this host; the job starts the MPI's daemon (Open MPI) or proxy "
                           "(Hydra) from there",
                           f"install the complete MPI at {folder} on every host")
    return CheckResult("mpirun", PASS, facts.mpirun)


def check_python(py: PythonFacts, expect: Expectations,
                 local: PythonFacts | None) -> CheckResult:
    if not py.found:
        if "/" not in expect.python:  # looked up on the PATH the ranks get
            fix = (f"the ranks find {expect.python} on the PATH dtlaunch exports (its own): "
                   "install it in the same directory on every host, or name the interpreter "
                   "by a path that exists everywhere")
        else:
            fix = ("create the same virtual environment at the same path on every host (or on "
                   "a shared filesystem), or pass --python with a path that exists everywhere")
        return CheckResult("python", FAIL, f"{expect.python}: {py.error or 'not found'}", fix)
    if py.error:
        return CheckResult("python", FAIL, py.error,
                           f"check that '{expect.python} -c pass' works on this host")
    if local is not None and local.found and local.version and py.minor != local.minor:
        return CheckResult("python", FAIL, f"Python {py.version} here, {local.version} on this "
                           "machine", "use the same Python minor version on every host "
                           "(packages built for one do not import in another)")
    return CheckResult("python", PASS, f"{py.version} {py.executable}")


def check_torch(py: PythonFacts, local: PythonFacts | None) -> CheckResult:
    if not py.found or py.error:
        return CheckResult("torch", SKIP, "no python")
    if py.torch_version is None and py.torch_imported is None:
        return CheckResult("torch", FAIL, f"torch is not installed for {py.executable}",
                           f"'{py.executable} -m pip install torch' (the same version everywhere)")
    if py.torch_error:
        return CheckResult("torch", FAIL, f"import torch fails: {py.torch_error}",
                           f"reinstall torch for {py.executable}")
    mine = py.torch_imported or py.torch_version
    theirs = (local.torch_imported or local.torch_version) if local else None
    if theirs and mine != theirs:
        return CheckResult("torch", FAIL, f"torch {mine} here, {theirs} on this machine",
                           f"install torch=={theirs} on this host")
    cuda = f" CUDA {py.torch_cuda}" if py.torch_cuda else ""
    return CheckResult("torch", PASS, f"{mine}{cuda}")


def check_horovod(py: PythonFacts, local: PythonFacts | None,
                  controller: str = "MPI") -> CheckResult:
    if not py.found or py.error:
        return CheckResult("horovod", SKIP, "no python")
    if py.horovod_version is None and py.horovod_imported is None:
        return CheckResult("horovod", FAIL, f"horovod is not installed for {py.executable}",
                           INSTALL_HOROVOD_HINT)
    if py.horovod_error:
        return CheckResult("horovod", FAIL, f"import horovod fails: {py.horovod_error}",
                           INSTALL_HOROVOD_HINT)
    mine = py.horovod_imported or py.horovod_version
    build = (f"frameworks {','.join(py.frameworks) or 'none'}; "
             f"controllers {','.join(py.controllers) or 'none'}; "
             f"tensor ops {','.join(py.tensor_ops) or 'none'}")
    theirs = (local.horovod_imported or local.horovod_version) if local else None
    if theirs and mine != theirs:
        return CheckResult("horovod", FAIL, f"horovod {mine} here, {theirs} on this machine",
                           f"install horovod {theirs} on this host")
    if py.torch_imported and not py.torch_error and controller not in py.controllers:
        return CheckResult("horovod", FAIL,
                           f"horovod {mine} was built without {controller} ({build})",
                           INSTALL_HOROVOD_HINT)
    return CheckResult("horovod", PASS, f"{mine} ({build})")


def check_script(facts: HostFacts, expect: Expectations) -> CheckResult:
    if expect.program:
        if not facts.program_path:
            where = ("on the PATH the job exports" if "/" not in expect.program
                     else "or not executable")
            return CheckResult("script", FAIL, f"{expect.program}: not found {where}",
                               f"install {expect.program} at the same path on every host (the "
                               "ranks look a bare name up on the PATH dtlaunch exports, its own)")
        if not expect.script and not expect.module:
            return CheckResult("script", PASS, facts.program_path)
    if expect.script:
        if facts.script_exists:
            return CheckResult("script", PASS, expect.script)
        return CheckResult("script", FAIL, f"no file {expect.script}",
                           "copy the script to the same path on every host (e.g. rsync -a) or "
                           "keep it on a shared filesystem")
    if expect.module:
        py = facts.python
        if not py.found or py.error:
            return CheckResult("script", SKIP, "no python")
        if py.module_found:
            return CheckResult("script", PASS, f"-m {expect.module}")
        top = expect.module.split(".")[0]
        return CheckResult("script", FAIL, f"module {top!r} is not importable by {py.executable}",
                           f"install the package that provides {top!r} for {py.executable}, or "
                           "run from a directory that holds it at the same path on every host")
    return CheckResult("script", SKIP, "no script given")


def _listing(ifaces: Sequence[Iface]) -> str:
    return "; ".join(i.describe() for i in ifaces) or "none"


def check_iface(facts: HostFacts, iface: Interfaces | None) -> CheckResult:
    ifaces = facts.ifaces
    if ifaces is None:
        return CheckResult("iface", WARN, "cannot list interfaces ('ip' not found)",
                           "install iproute2 so the interfaces can be checked")
    if iface is None:
        suspicious = [i.name for i in ifaces if i.up and i.name != "lo"
                      and i.name.startswith(UNROUTABLE_PREFIXES) and i.ipv4()]
        if suspicious:
            return CheckResult("iface", WARN, "no --iface given and likely unroutable networks "
                               "are up: " + ", ".join(suspicious),
                               "pass --iface with the cluster's subnet (e.g. --iface 10.0.0.0/24) "
                               "so MPI does not pick one of them and hang")
        return CheckResult("iface", SKIP, "no --iface given")
    by_name = {i.name: i for i in ifaces}
    if iface.names:
        missing = [n for n in iface.names if n not in by_name]
        down = [n for n in iface.names if n in by_name and not by_name[n].up]
        if missing or down:
            parts = [f"{what}: {', '.join(names)}"
                     for what, names in (("missing", missing), ("down", down)) if names]
            detail = f"{'; '.join(parts)}; this host has {_listing(ifaces)}"
            return CheckResult("iface", FAIL, detail,
                               "interface names differ between hosts: pass the subnet as a CIDR "
                               "instead (e.g. --iface 10.0.0.0/24), or names every host has; "
                               "bring a down interface up with 'ip link set NAME up'")
        return CheckResult("iface", PASS, ", ".join(iface.names))
    networks = [ipaddress.ip_network(c) for c in iface.cidrs]
    matches = [(i.name, str(a)) for i in ifaces if i.up for a in i.ipv4()
               if any(a.ip in n for n in networks)]
    if not matches:
        return CheckResult("iface", FAIL, f"no address in {', '.join(iface.cidrs)} on an interface "
                           f"that is up; this host has {_listing(ifaces)}",
                           "pass a subnet every host has an address in (see the list), or fix this "
                           "host's network configuration")
    return CheckResult("iface", PASS, ", ".join(f"{n} {a}" for n, a in matches))


def check_pairwise(facts: HostFacts, expect: Expectations, peers: Sequence[str]) -> CheckResult:
    if not expect.pairwise:
        return CheckResult("pairwise", SKIP, "not checked (run launches without tree spawn)")
    if not peers:
        return CheckResult("pairwise", SKIP, "no other hosts")
    results = {p.peer: p for p in facts.peers}
    bad = [f"{peer}: " + (results[peer].message or f"ssh exit {results[peer].exit_code}")
           if peer in results else f"{peer}: no answer" for peer in peers
           if peer not in results or results[peer].exit_code != 0]
    if bad:
        return CheckResult("pairwise", FAIL, "cannot ssh to " + "; ".join(bad),
                           "Open MPI's tree spawn needs every host to log in to every other one "
                           "without a prompt (keys and known_hosts on every host); or launch "
                           "without --tree-spawn (the default), which needs only ssh from this "
                           "machine to each host")
    return CheckResult("pairwise", PASS, f"reaches {len(peers)} host(s)")


def check_hostnames(names: Mapping[str, str]) -> dict[str, CheckResult]:
    """Host (as given) -> its reported hostname; every name must be unique."""
    seen: dict[str, list[str]] = {}
    for host, name in names.items():
        if name:
            seen.setdefault(name, []).append(host)
    results: dict[str, CheckResult] = {}
    for host, name in names.items():
        if not name:
            results[host] = CheckResult("hostname", SKIP, "unknown")
            continue
        others = [h for h in seen[name] if h != host]
        if others:
            results[host] = CheckResult(
                "hostname", FAIL, f"{name!r} is also the hostname of {', '.join(others)}",
                "give every host its own hostname ('hostnamectl set-hostname NAME'): MPI and "
                "NCCL confuse hosts that share one")
        else:
            results[host] = CheckResult("hostname", PASS, name)
    return results
