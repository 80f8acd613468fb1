"""NVIDIA GPUs on the hosts (HostFacts.gpus, read by facts.py): mismatches, slots. Pure.

`check_gpus` compares the rank hosts and returns one result with a fix per mismatch (driver,
CUDA, NCCL, GPU count), which doctor shows as rows of the whole job (verdict.gpu_checks);
`choose_slots` gives hosts whose slots were not written (Host.slots_given) one slot per GPU
(Horovod's one process per GPU) once the run's pre-flight, or its cache, has counted them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtlaunch.job.hosts import Host

if TYPE_CHECKING:  # a run uses only the slots part: the checks' model is imported by check_gpus
    from dtlaunch.check.facts import GpuFacts
    from dtlaunch.check.report import CheckResult


def _versions(values: Mapping[str, str | None]) -> str:
    by_version: dict[str, list[str]] = {}
    for host, version in values.items():
        by_version.setdefault(version or "none", []).append(host)
    return ", ".join(f"{v} on {', '.join(hs)}" for v, hs in sorted(by_version.items()))


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def check_gpus(gpus: Mapping[str, GpuFacts], torch_cuda: Mapping[str, str | None] | None = None,
               nccl: Mapping[str, str | None] | None = None) -> tuple[CheckResult, ...]:
    """Compare the hosts' GPUs, drivers, CUDA and NCCL (torch's, from the probe's facts)."""
    from dtlaunch.check.report import FAIL, PASS, SKIP, WARN, CheckResult

    torch_cuda, nccl = torch_cuda or {}, nccl or {}
    with_gpus = {h: f for h, f in gpus.items() if f.count}
    results: list[CheckResult] = []
    for host, facts in gpus.items():
        if facts.error:
            hint = ("load the NVIDIA driver on that host (after a driver upgrade, "
                    "'Driver/library version mismatch' needs a reboot)")
            if facts.error.startswith("nvidia-smi did not answer"):
                hint = (f"a hung nvidia-smi means a stuck GPU or driver, where CUDA hangs too: look "
                        f"for Xid errors in 'dmesg' on {host}, reset the GPU or reboot, or leave "
                        "the host out")
            results.append(CheckResult("gpus", FAIL, f"{host}: nvidia-smi failed: {facts.error}",
                                       hint))
    if not with_gpus:
        return tuple(results) or (CheckResult("gpus", SKIP, "no NVIDIA GPU on any host"),)
    without = [h for h, f in gpus.items() if not f.count and not f.error]
    if without:
        results.append(CheckResult("gpus", WARN, f"no NVIDIA GPU on {', '.join(without)} while "
                                   f"{', '.join(with_gpus)} have some",
                                   "leave those hosts out, or give every host's slots explicitly"))
    counts = {h: str(f.count) for h, f in with_gpus.items()}
    if len(set(counts.values())) > 1:
        results.append(CheckResult("gpus", WARN, f"GPUs per host differ: {_versions(counts)}",
                                   "give the slots explicitly (-H h1:4,h2:4) for the same number "
                                   "of ranks on every host (hierarchical operations need it)"))
    drivers = {h: f.driver for h, f in with_gpus.items()}
    if len(set(drivers.values())) > 1:
        results.append(CheckResult("gpus", WARN, f"NVIDIA drivers differ: {_versions(drivers)}",
                                   "install the same driver version on every host"))
    for host, facts in with_gpus.items():
        built = torch_cuda.get(host)
        if built and facts.cuda and _major_minor(built) > _major_minor(facts.cuda):
            results.append(CheckResult("gpus", FAIL, f"{host}: PyTorch is built for CUDA {built} "
                                       f"but the driver supports CUDA {facts.cuda} at most",
                                       f"upgrade the NVIDIA driver on {host}, or install a PyTorch "
                                       f"built for CUDA {facts.cuda} or older"))
    for what, values in (("CUDA builds of PyTorch", torch_cuda), ("NCCL versions", nccl)):
        seen = {h: v for h, v in values.items() if h in with_gpus}
        if len(set(seen.values())) > 1:
            results.append(CheckResult("gpus", FAIL, f"{what} differ: {_versions(seen)}",
                                       "install the same PyTorch build on every host: ranks with "
                                       "different NCCL versions hang or fail in their first "
                                       "allreduce"))
    if not results:
        first = next(iter(with_gpus.values()))
        results.append(CheckResult("gpus", PASS, f"{first.count} x {first.gpus[0].name} per host, "
                                   f"driver {first.driver}, CUDA {first.cuda or '?'}"))
    return tuple(results)


# --- slots for a run ------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotChoice:
    """The hosts to plan with once the GPUs are known, and where their slots came from."""

    hosts: tuple[Host, ...]
    changed: bool  # some slots now come from GPUs
    text: str


def slots_pending(hosts: Sequence[Host]) -> bool:
    """Some slots are not written (or no hosts: this machine), so GPUs may decide them."""
    return not hosts or any(not h.slots_given for h in hosts)


def visible_devices(value: str, count: int) -> int:
    """How many of `count` GPUs CUDA_VISIBLE_DEVICES leaves visible (CUDA stops at the first
    invalid entry, e.g. -1)."""
    visible = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        visible += 1
    return min(visible, count)


def choose_slots(hosts: Sequence[Host], counts: Mapping[str, int], num_proc: int | None,
                 here: str = "localhost") -> SlotChoice:
    """One slot per GPU where no slots were written; written slots always win.

    `counts`: GPUs per host name from the pre-flight; no hosts means this machine (`here`),
    whose one-slot-per-core default becomes one slot per GPU. More processes than slots need
    --oversubscribe here as on hosts (plan.choose_num_proc): `num_proc` changes nothing."""
    if not hosts:
        n = counts.get(here, 0)
        if not n:
            return SlotChoice((), False, "slots: this machine, one per core (no NVIDIA GPU)")
        return SlotChoice((Host(here, n),), True, f"slots: this machine, one per NVIDIA GPU ({n})")
    chosen: list[Host] = []
    from_gpus: list[str] = []
    standing_in: list[str] = []
    for host in hosts:
        n = counts.get(host.name, 0)
        if host.slots_given or not n:
            chosen.append(host)
            if not host.slots_given:
                standing_in.append(host.name)
        else:
            chosen.append(Host(host.name, n))
            from_gpus.append(f"{host.name}:{n}")
    parts = [f"one per NVIDIA GPU on {', '.join(from_gpus)}"] if from_gpus else []
    if standing_in:
        parts.append(f"1 on {', '.join(standing_in)} (none given, no NVIDIA GPU)")
    given = [f"{h.name}:{h.slots}" for h in hosts if h.slots_given]
    if given:
        parts.append(f"as given on {', '.join(given)}")
    return SlotChoice(tuple(chosen), bool(from_gpus), "slots: " + "; ".join(parts))


def unchecked_slots_text(hosts: Sequence[Host], why: str) -> str | None:
    """Where the slots of a plan made without the pre-flight's GPUs came from (None: all given)."""
    if not hosts:
        return f"slots: this machine, one per core ({why}; a checked run gives one per NVIDIA GPU)"
    missing = [h.name for h in hosts if not h.slots_given]
    if not missing:
        return None
    return (f"slots: 1 on {', '.join(missing)} (none given; {why}; a checked run gives hosts "
            "with NVIDIA GPUs one slot per GPU)")
