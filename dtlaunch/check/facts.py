"""What a host told us about itself, and how to read it. Pure code: no I/O.

The probe (dtlaunch.probe.command) prints sections headed by `@@name` lines; `parse_probe_output` turns
that text into `HostFacts`, which the pure checks (dtlaunch.check.host_checks) judge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

from dtlaunch.check.gpu_facts import GpuFacts, nccl_from_code, parse_gpu_probe
from dtlaunch.core.mpi_kinds import MpiImpl, parse_mpirun_version

SECTION_MARK = "@@"


@dataclass(frozen=True)
class Iface:
    name: str
    up: bool
    addresses: tuple[str, ...] = ()  # "10.0.0.2/24"

    def describe(self) -> str:
        state = "up" if self.up else "down"
        return f"{self.name} ({state}{', ' + ', '.join(self.addresses) if self.addresses else ''})"

    def ipv4(self) -> list[ipaddress.IPv4Interface]:
        """Its IPv4 addresses, each with its prefix; text that is no address is left out."""
        found = []
        for text in self.addresses:
            with contextlib.suppress(ValueError):
                value = ipaddress.ip_interface(text)
                if isinstance(value, ipaddress.IPv4Interface):
                    found.append(value)
        return found


@dataclass(frozen=True)
class PythonFacts:
    found: bool
    executable: str = ""
    version: str = ""  # "3.11.7"
    error: str = ""
    torch_version: str | None = None  # from package metadata (cheap)
    horovod_version: str | None = None
    torch_imported: str | None = None  # torch.__version__ after a real import (cached per host)
    torch_error: str = ""
    torch_cuda: str | None = None
    torch_nccl: str | None = None
    horovod_imported: str | None = None
    horovod_error: str = ""
    horovod_nccl: str | None = None  # the NCCL Horovod was built with (nccl_built())
    horovod_mpi_lib: str | None = None  # the libmpi file `import horovod.torch` loaded
    frameworks: tuple[str, ...] = ()
    controllers: tuple[str, ...] = ()
    tensor_ops: tuple[str, ...] = ()
    import_cached: bool = False
    import_cache_problem: str = ""  # why the import cache could not be used on that host
    module_found: bool | None = None

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


@dataclass(frozen=True)
class PeerResult:
    peer: str
    exit_code: int
    message: str = ""


@dataclass(frozen=True)
class HostFacts:
    hostname: str = ""
    path: str = ""
    mpirun: str | None = None
    mpi_launcher: str = ""  # this machine's mpirun path, looked for here ("": the login PATH's)
    orted: str | None = None
    mpi: MpiImpl | None = None
    ifaces: tuple[Iface, ...] | None = None  # None: the host could not list them
    python: PythonFacts = PythonFacts(found=False)
    peers: tuple[PeerResult, ...] = ()
    script_exists: bool | None = None  # None: no script to look for
    program_path: str = ""  # the command's executable as the job finds it ("": not found, not asked)
    gpus: GpuFacts = field(default_factory=GpuFacts)  # NVIDIA GPUs, from nvidia-smi (none when it is absent)


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(SECTION_MARK) and re.fullmatch(r"@@[a-z_]+", line.strip()):
            current = sections.setdefault(line.strip()[2:], [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


_LINK_RE = re.compile(r"^\d+:\s+([^:@\s]+)(?:@\S+)?:\s+<([^>]*)>")
_ADDR_RE = re.compile(r"^\d+:\s+(\S+)\s+inet6?\s+(\S+)")


def parse_ip_output(link_text: str, addr_text: str) -> tuple[Iface, ...] | None:
    """`ip -o link show` and `ip -o addr show` into interfaces with their state and addresses."""
    states: dict[str, bool] = {}
    for line in link_text.splitlines():
        match = _LINK_RE.match(line.strip())
        if match:
            flags = match.group(2).split(",")
            # Loopback reports no carrier; everything else needs UP and a carrier.
            states[match.group(1)] = "UP" in flags and (
                "LOWER_UP" in flags or match.group(1) == "lo")
    if not states:
        return None
    addresses: dict[str, list[str]] = {name: [] for name in states}
    for line in addr_text.splitlines():
        match = _ADDR_RE.match(line.strip())
        if match:
            name = match.group(1).split("@")[0]
            addresses.setdefault(name, []).append(match.group(2))
    return tuple(Iface(name, states.get(name, False), tuple(addresses.get(name, ())))
                 for name in states)


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def parse_python_json(text: str) -> PythonFacts:
    """The JSON document printed by the Python half of the probe."""
    last = text.strip().splitlines()[-1] if text.strip() else ""
    try:
        data = json.loads(last)
    except ValueError:
        return PythonFacts(found=True, error="the interpreter could not run the probe: "
                           f"{last or 'no output'}")
    if not isinstance(data, dict):
        return PythonFacts(found=True, error="unexpected probe output")
    if data.get("missing"):
        return PythonFacts(found=False, error=str(data.get("error", "not found")))
    imports = data.get("imports") or {}

    def names(key: str) -> tuple[str, ...]:
        value = imports.get(key) or ()
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    return PythonFacts(
        found=True,
        executable=str(data.get("executable", "")),
        version=str(data.get("version", "")),
        torch_version=_str_or_none(data.get("torch")),
        horovod_version=_str_or_none(data.get("horovod")),
        torch_imported=_str_or_none(imports.get("torch")),
        torch_error=str(imports.get("torch_error", "")),
        torch_cuda=_str_or_none(imports.get("torch_cuda")),
        torch_nccl=_str_or_none(imports.get("torch_nccl")),
        horovod_imported=_str_or_none(imports.get("horovod")),
        horovod_error=str(imports.get("horovod_error", "")),
        horovod_nccl=nccl_from_code(imports.get("horovod_nccl")),
        horovod_mpi_lib=_str_or_none(imports.get("horovod_mpi_lib")),
        frameworks=names("frameworks"),
        controllers=names("controllers"),
        tensor_ops=names("tensor_ops"),
        import_cached=bool(data.get("cached", False)),
        import_cache_problem=str(data.get("cache_problem") or "")[:300],
        module_found=data.get("module_found"),
    )


def parse_peers(text: str) -> tuple[PeerResult, ...]:
    peers: list[PeerResult] = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            peers.append(PeerResult(parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""))
    return tuple(peers)


def parse_probe_output(text: str) -> HostFacts:
    sections = split_sections(text)
    version_text = sections.get("mpirun_version", "")
    mpirun = sections.get("mpirun") or None
    return HostFacts(
        hostname=sections.get("hostname", "").strip(),
        path=sections.get("path", ""),
        mpirun=mpirun,
        mpi_launcher=sections.get("launcher", ""),
        orted=sections.get("orted") or None,
        mpi=parse_mpirun_version(version_text) if mpirun else None,
        ifaces=parse_ip_output(sections.get("ip_link", ""), sections.get("ip_addr", "")),
        python=parse_python_json(sections.get("python", "")),
        peers=parse_peers(sections.get("peers", "")),
        script_exists={"yes": True, "no": False}.get(sections.get("script", "")),
        program_path=sections.get("program", "").strip(),
        gpus=parse_gpu_probe(sections.get("gpu_status", ""), sections.get("gpu_query", ""),
                             sections.get("gpu_header", "")),
    )
