"""Figure 2: doctor fan-out. `dtlaunch doctor` (all checks) on 1, 8 and 32 test-bed hosts vs
horovodrun's SSH reachability check alone and vs parallel OpenSSH (`ssh host true` for every host
at once), then the same with a simulated 200 ms connect latency per host (ssh ProxyCommand that
sleeps before connecting). Writes a markdown table and a PNG (wall time vs hosts).

    python bench/doctor_fanout.py [--reps 5] [--hosts 1,8,32] [--latency-hosts 8,32]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    TINY_JOB,
    Sample,
    Series,
    baseline_env,
    baseline_tree,
    bed_of,
    bench_parser,
    command_line,
    dtlaunch_argv,
    figure,
    fmt_s,
    horovodrun_env,
    host_counts,
    hosts_axes,
    latency_config,
    loadavg,
    log,
    md_table,
    publish,
    ratio,
    round_robin,
    run_header,
    ssh_wrapper,
    timed,
    worktree_env,
)

GOAL = 0.5  # doctor / horovodrun's check, 32 hosts
GOAL_FLOOR = 1.10  # doctor / parallel `ssh host true`, at 64 and 128 hosts
DELAY = 0.2

# What horovodrun 0.28.1 runs before every multi-host launch (horovod/runner/launch.py):
# `ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no host -o ConnectTimeout=10 true`
# for every remote host in parallel threads, up to 5 tries each. fn_cache=None: no 60-minute cache.
HVD_CHECK = ("import sys\n"
             "from horovod.runner.launch import _check_all_hosts_ssh_successful as check\n"
             "sys.exit(0 if check(sys.argv[1:], None, None, fn_cache=None) else 1)\n")

TOOLS = ("dtlaunch doctor", "horovodrun ssh check", "parallel ssh true")


LAT_SUFFIX = " +latency"


def _doctor(hosts: list[str], subnet: str, cfg: Path, env: dict[str, str]) -> Sample:
    return timed(dtlaunch_argv("doctor", "-H", ",".join(hosts), "--iface", subnet,
                               "--ssh-config", str(cfg), TINY_JOB), env=env, watch_rss=True)


def _hvd(hosts: list[str], env: dict[str, str]) -> Sample:
    return timed([PYTHON, "-c", HVD_CHECK, *hosts], env=env, watch_rss=True)


def _pssh(hosts: list[str], cfg: Path, env: dict[str, str]) -> Sample:
    return timed(["sh", "-c", 'cfg=$1; shift; pids=; for h in "$@"; do '
                  'ssh -F "$cfg" "$h" true & pids="$pids $!"; done; fail=0; '
                  'for p in $pids; do wait "$p" || fail=1; done; exit $fail',
                  "pssh", str(cfg), *hosts], env=env)


def measure(max_hosts: int, counts: list[int], latency_counts: list[int],
            reps: int, base: str | None = None, rev: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"plain": {}, "latency": {}, "load": "", "rev": rev if base else ""}
    before = loadavg()
    with bed_of(max_hosts) as bed:
        names: list[str] = bed.names  # type: ignore[attr-defined]
        subnet: str = bed.subnet  # type: ignore[attr-defined]
        env = worktree_env()
        lat_cfg = latency_config(bed, DELAY, Path(bed.workdir) / "ssh_config_slow")  # type: ignore[attr-defined]
        plain_cfg = Path(bed.ssh_config)  # type: ignore[attr-defined]
        with ssh_wrapper(plain_cfg) as wrap, ssh_wrapper(lat_cfg) as lat_wrap:
            wraps = {"plain": wrap, "latency": lat_wrap}
            cfgs = {"plain": plain_cfg, "latency": lat_cfg}
            # Per host count, the plain and the slow-link variants run in ONE round-robin, so
            # "added by the latency" compares samples taken side by side.
            for n in sorted(set(counts) | set(latency_counts)):
                hosts = names[:n]
                tools: dict[str, Callable[[], Sample]] = {}
                for label in ("plain", "latency"):
                    if n not in (counts if label == "plain" else latency_counts):
                        continue
                    cfg = cfgs[label]
                    hvd_env = horovodrun_env(env, wraps[label])
                    doctor = partial(_doctor, hosts, subnet, cfg, env)
                    suffix = "" if label == "plain" else LAT_SUFFIX
                    tools[TOOLS[0] + suffix] = doctor
                    tools[TOOLS[1] + suffix] = partial(_hvd, hosts, hvd_env)
                    tools[TOOLS[2] + suffix] = partial(_pssh, hosts, cfg, env)
                    if base is not None:
                        tools[f"dtlaunch doctor @{rev}" + suffix] = partial(
                            _doctor, hosts, subnet, cfg, baseline_env(base))
                series = round_robin(tools, reps, warmup=1, label=f"doctor {n} hosts")
                for label in ("plain", "latency"):
                    suffix = "" if label == "plain" else LAT_SUFFIX
                    picked = {k.removesuffix(suffix): v for k, v in series.items()
                              if (k.endswith(LAT_SUFFIX) if suffix else not k.endswith(LAT_SUFFIX))}
                    if picked:
                        out[label][n] = picked
    out["load"] = f"{before} → {loadavg()}"
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    with figure(path, dpi=110, figsize=(7, 4.5)) as (_, ax):
        colors = dict(zip(TOOLS, ("tab:blue", "tab:red", "tab:gray")))
        for label, style, suffix in (("plain", "-o", ""),
                                     ("latency", "--s", f" (+{DELAY * 1000:.0f} ms connect)")):
            data = res[label]
            if not data:
                continue
            counts = sorted(data)
            for tool in TOOLS:
                ax.plot(counts, [data[n][tool].median for n in counts], style,
                        color=colors[tool], label=tool + suffix)
        ax.set_ylabel("wall time, s (median)")
        ax.set_title("dtlaunch doctor (all checks) vs horovodrun's SSH check vs parallel ssh")
        hosts_axes([ax], sorted(res["plain"]), log2=True)


def report(res: dict[str, Any], reps: int, png: str | None, command: str = "") -> str:
    parts = ["## 2. Doctor fan-out", ""]
    if command:
        parts += [*run_header(command, "."), ""]
    parts += [f"Medians of {reps} repetitions (min–max), load average {res['load']}. "
              f"Goals: doctor on the most hosts ≤ {GOAL} × horovodrun's SSH check, and ≤ "
              f"{GOAL_FLOOR:.2f} × the parallel-ssh floor at 64 hosts and more.", ""]
    rows = []
    for n in sorted(res["plain"]):
        s: dict[str, Series] = res["plain"][n]
        d, h, p = (s[t] for t in TOOLS)
        rows.append([n, fmt_s(d), fmt_s(h), fmt_s(p), f"{ratio(d.median, h.median):.2f}",
                     f"{ratio(d.median, p.median):.2f}"])
    parts += [md_table(["hosts", "dtlaunch doctor s", "horovodrun ssh check s", "parallel `ssh true` s",
                        "doctor / horovodrun", "doctor / parallel ssh"], rows), ""]
    rows = []
    for n in sorted(res["plain"]):
        s = res["plain"][n]
        rows.append([n, *(f"{s[t].cpu_median:.2f}" for t in TOOLS),
                     *(f"{s[t].peak_rss_mib:.0f}" for t in TOOLS[:2])])
    parts += ["Launcher-side CPU (user + system seconds of the tool and its local children, "
              "medians; the hosts' sshd and login shells are not included) and peak RSS of the "
              "tool's own process:", "",
              md_table(["hosts", "doctor CPU s", "horovodrun check CPU s", "parallel ssh CPU s",
                        "doctor RSS MiB", "horovodrun check RSS MiB"], rows), ""]
    if res["plain"]:
        top = max(res["plain"])
        r = ratio(res["plain"][top][TOOLS[0]].median, res["plain"][top][TOOLS[1]].median)
        parts += [f"Goal on {top} hosts: {r:.2f} ≤ {GOAL}: **{'met' if r <= GOAL else 'MISSED'}**.", ""]
        for n in (n for n in sorted(res["plain"]) if n >= 64):
            f = ratio(res["plain"][n][TOOLS[0]].median, res["plain"][n][TOOLS[2]].median)
            parts += [f"Floor goal on {n} hosts: doctor / parallel ssh = {f:.2f} ≤ {GOAL_FLOOR:.2f}: "
                      f"**{'met' if f <= GOAL_FLOOR else 'MISSED'}**.", ""]
    if res["latency"]:
        rows = []
        for n in sorted(res["latency"]):
            s = res["latency"][n]
            base = res["plain"].get(n)
            cells: list[object] = [n]
            for tool in TOOLS:
                extra = f" (+{s[tool].median - base[tool].median:.2f})" if base else ""
                cells.append(fmt_s(s[tool]) + extra)
            rows.append(cells)
        parts += [f"**With {DELAY * 1000:.0f} ms connect latency per host** (ssh `ProxyCommand` "
                  f"`sh -c 'sleep {DELAY}; exec nc %h %p'`; in brackets: the seconds added vs no "
                  "latency, both measured in the same round-robin; one latency per host one after "
                  f"another would add {max(res['latency']) * DELAY:.1f} s on {max(res['latency'])} hosts)", "",
                  md_table(["hosts", *TOOLS], rows), ""]
    if res["rev"]:
        before = f"dtlaunch doctor @{res['rev']}"
        rows = []
        for label in ("plain", "latency"):
            for n in sorted(res[label]):
                s = res[label][n]
                rows.append([n, "yes" if label == "latency" else "no", fmt_s(s[before]),
                             fmt_s(s[TOOLS[0]]), f"{ratio(s[TOOLS[0]].median, s[before].median):.2f}",
                             f"{s[before].cpu_median:.2f} → {s[TOOLS[0]].cpu_median:.2f}"])
        parts += [f"Before/after (same run): doctor as of `{res['rev']}` vs this revision", "",
                  md_table(["hosts", "latency", "before s", "after s", "after / before",
                            "launcher CPU s before → after"], rows), ""]
    if png:
        parts += [f"![doctor fan-out]({png})", ""]
    parts += [
        "Method: one bed of the largest size, the first N hosts used; doctor runs from the root "
        "namespace with the bed's ssh config, `--iface <bed subnet>` and a script, so every check "
        "runs (reach, mpirun, mpi, python, torch, horovod, script, iface, hostname) plus the "
        "launcher's own probe. horovodrun's check is its own function "
        "`horovod.runner.launch._check_all_hosts_ssh_successful` (parallel `ssh -o "
        "PasswordAuthentication=no -o StrictHostKeyChecking=no HOST -o ConnectTimeout=10 true`), "
        "run in a fresh Python as horovodrun runs it (import included), with its 60-minute cache "
        "off and an `ssh` wrapper on PATH that adds `-F <bed ssh_config>` (OpenSSH ignores "
        "`$HOME` when it looks for `~/.ssh/config`). Parallel ssh: `ssh -F cfg HOST true &` for "
        "every host, then wait. Every remote login runs the machine's real login shell (root's "
        "`~/.bashrc`, which runs `pyenv init`), and all the bed's hosts share this machine's 2 "
        "cores, so at 32 hosts every tool is CPU-bound on the hosts' side.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    parser = bench_parser(__doc__, reps=5, hosts="1,8,32", out="doctor_fanout.md",
                          png="doctor_fanout.png",
                          baseline="also run dtlaunch doctor as of git revision REV (before/after)")
    parser.add_argument("--latency-hosts", default="8,32")
    args = parser.parse_args(argv)
    counts = host_counts(args.hosts)
    lat = host_counts(args.latency_hosts)
    with baseline_tree(args.baseline) as base:
        res = measure(max(counts + lat), counts, lat, args.reps, base, args.baseline or "")
    command = command_line("doctor_fanout.py", argv)
    text = publish(args.out, res, lambda png: report(res, args.reps, png, command), args.png,
                   lambda path: plot(res, path))
    res_summary = {n: {t: s.median for t, s in v.items()} for n, v in res["plain"].items()}
    log(f"summary: {res_summary}")
    return text


if __name__ == "__main__":
    main()
