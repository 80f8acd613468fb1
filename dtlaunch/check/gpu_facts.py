"""What nvidia-smi said on a host, read into GpuFacts (HostFacts.gpus). Pure code.

Apart from the GPU checks (gpus.py) because the facts and the report model both hold GpuFacts,
and the checks return the report's CheckResult.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

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
