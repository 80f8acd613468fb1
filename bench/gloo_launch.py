"""Gloo launch: the tiny Horovod job (init + one allreduce) on N test-bed hosts with Horovod's
Gloo controller, `dtlaunch run --gloo --no-check` against `horovodrun --gloo`, and dtlaunch's
MPI path for reference, all from inside host h1 (its network, hostname and /etc/hosts, where
every bed host's name resolves, as Horovod's Gloo process sets need).

    python bench/gloo_launch.py [--reps 5] [--hosts 2]
"""

from __future__ import annotations

from typing import Any

from common import (
    PYTHON,
    TINY_JOB,
    Sample,
    Series,
    bench_parser,
    dtlaunch_argv,
    fmt_s,
    horovodrun_env,
    horovodrun_path,
    host_counts,
    md_table,
    measured,
    publish,
    ratio,
    resolving_bed,
    timed,
    worktree_env,
)


def measure(n: int, reps: int) -> dict[str, Any]:
    with resolving_bed(n) as (bed, wrap, inside):
        cfg = str(bed.ssh_config)
        hosts = ",".join(f"{h}:1" for h in bed.names)
        addrs = ",".join(f"{h.address}:1" for h in bed.hosts)
        env = worktree_env()
        dt = ["run", "--no-check", "-H", hosts, "--iface", "eth0", "--ssh-config", cfg]

        def run(argv: list[str], e: dict[str, str]) -> Sample:
            return timed(inside + argv, env=e, cwd="/tmp", watch_rss=True)

        tools = {
            "dtlaunch --gloo --no-check": lambda: run(dtlaunch_argv(*dt[:1], "--gloo", *dt[1:],
                                                                    PYTHON, TINY_JOB), env),
            "dtlaunch (MPI) --no-check": lambda: run(dtlaunch_argv(*dt, PYTHON, TINY_JOB), env),
        }
        hvdrun = horovodrun_path()
        if hvdrun:
            tools["horovodrun --gloo"] = lambda: run(
                [hvdrun, "--gloo", "-np", str(n), "-H", addrs, "--network-interface", "eth0",
                 "--disable-cache", PYTHON, TINY_JOB], horovodrun_env(env, wrap))
        return {"hosts": n, **measured(tools, reps, f"gloo launch {n} hosts")}


def report(results: list[dict[str, Any]]) -> str:
    parts = ["## Gloo launch: tiny Horovod job (init + one allreduce), Gloo controller", ""]
    for res in results:
        series: dict[str, Series] = res["series"]
        base = series.get("horovodrun --gloo")
        rows = [[name, fmt_s(s), f"{ratio(s.median, base.median):.2f}" if base else "–",
                 f"{s.cpu_median:.2f}", f"{s.peak_rss_mib:.0f}" if s.peak_rss_mib else "–"]
                for name, s in series.items()]
        parts += [f"**{res['hosts']} hosts** (load average {res['load']})", "",
                  md_table(["launcher", "wall s, median (min–max)", "× horovodrun --gloo",
                            "CPU s on h1", "launcher peak RSS MiB"], rows), ""]
    parts += ["Method: each repetition runs every launcher once, the order rotating; one "
              "warm-up round is dropped. horovodrun gets the hosts' addresses and an `ssh` that "
              "adds the bed's ssh config (see launch_overhead.py). \"CPU s on h1\" counts the "
              "launcher and what it started as its own children; ranks that an sshd started "
              "(all of dtlaunch --gloo's) are not in it.", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    args = bench_parser(__doc__, reps=5, hosts="2", out="gloo_launch.md").parse_args(argv)
    results = [measure(n, args.reps) for n in host_counts(args.hosts)]
    return publish(args.out, results, lambda png: report(results))


if __name__ == "__main__":
    main()
