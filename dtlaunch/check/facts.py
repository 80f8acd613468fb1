"""What a host told us about itself, and how to read it. Pure code: no I/O.

The probe (dtlaunch.probe.command) prints sections headed by `@@name` lines; `parse_probe_output` turns
that text into `HostFacts`, which the pure checks (dtlaunch.check.host_checks) judge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dtlaunch.core.mpi_kinds import MpiImpl, parse_mpirun_version

SECTION_MARK = "@@"
_HEADER_RE = re.compile(r"Driver Version:\s*([0-9][0-9.]*).*?CUDA Version:\s*([0-9][0-9.]*|N/A)")
_MIB_RE = re.compile(r"^(\d+)\s*MiB$")
NO_DRIVER_PREFIX = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver: str
    memory_mib: int | None = None


@dataclass(frozen=True)
class GpuFacts:
    """One host's GPUs. `smi`: nvidia-smi was found; `error`: it was found but failed."""

    smi: bool = False
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    cuda: str | None = None  # the highest CUDA version the driver supports
    error: str = ""
    note: str = ""  # why a host with nvidia-smi has no usable GPU (no driver loaded)

    @property
    def count(self) -> int:
        return len(self.gpus)


def _error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "no output"


def parse_gpu_query(text: str) -> tuple[tuple[Gpu, ...], str]:
    """The CSV lines of the query into GPUs; text that is not such lines is an error message."""
    gpus: list[Gpu] = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        head, _, rest = line.partition(",")
        # The name may hold commas; the three last fields do not.
        fields = [f.strip() for f in rest.rsplit(",", 3)]
        if not head.strip().isdigit() or len(fields) != 4 or not fields[1].startswith(("GPU-", "MIG-")):
            return (), _error_line(text)
        memory = _MIB_RE.match(fields[3])
        gpus.append(Gpu(int(head), fields[0], fields[1], fields[2],
                        int(memory.group(1)) if memory else None))
    return tuple(gpus), ""


def parse_smi_header(text: str) -> tuple[str | None, str | None]:
    """(driver, CUDA) from the banner of plain `nvidia-smi`."""
    match = _HEADER_RE.search(text)
    if not match:
        return None, None
    return match.group(1), None if match.group(2) == "N/A" else match.group(2)


def parse_gpu_facts(query: str | None, header: str | None = None) -> GpuFacts:
    """query/header: the two outputs; None: nvidia-smi is not on this host."""
    if query is None:
        return GpuFacts()
    gpus, error = parse_gpu_query(query)
    if error == "No devices were found":
        return GpuFacts(smi=True)
    if error.startswith(NO_DRIVER_PREFIX):
        # nvidia-smi installed without a driver (a CPU host built from a CUDA image): no GPUs.
        return GpuFacts(smi=True, note="nvidia-smi found but no NVIDIA driver loaded")
    driver, cuda = parse_smi_header(header or "")
    drivers = sorted({g.driver for g in gpus})
    return GpuFacts(True, gpus, driver or (drivers[0] if drivers else None), cuda, error)


def parse_gpu_probe(status: str, query: str, header: str) -> GpuFacts:
    """The probe's @@gpu_status, @@gpu_query and @@gpu_header sections (probe.sh).

    status: `absent` (no nvidia-smi), or one `query|header done|timeout MS` line each. A hung
    query is a fact (an error naming the timeout); a hung banner only loses the CUDA version."""
    states = dict(line.split(" ", 1) for line in status.splitlines() if " " in line.strip())
    if not states:
        return GpuFacts()
    query_state = states.get("query", "")
    if query_state.startswith("timeout"):
        millis = query_state.split()[-1]
        seconds = f"{int(millis) / 1000:g}" if millis.isdigit() else "?"
        return GpuFacts(smi=True, error=f"nvidia-smi did not answer within {seconds} s")
    return parse_gpu_facts(query, header if states.get("header") == "done" else None)


def nccl_from_code(code: object) -> str | None:
    """NCCL_VERSION_CODE (what horovod's nccl_built() returns) as `2.18.1`; 0/False: none."""
    if isinstance(code, bool) or not isinstance(code, int) or code <= 1:
        return None
    if code >= 20900:  # 2.9 and later: major * 10000 + minor * 100 + patch
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def describe_gpus(facts: GpuFacts) -> str:
    """`2 x NVIDIA A100-SXM4-40GB` (models in index order, grouped)."""
    if facts.error:
        return f"nvidia-smi failed: {facts.error}"
    if not facts.gpus:
        return f"none ({facts.note})" if facts.note else "none"
    groups = Counter(gpu.name for gpu in facts.gpus)  # in index order, as first seen
    return ", ".join(f"{n} x {name}" for name, n in groups.items())


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
