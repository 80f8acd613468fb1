"""Horovod's own elastic scenarios, run through `dtlaunch run`: the peer test of issue 25.

Horovod's repository drives its elastic integration tests with a torch main script
(`test/integration/data/elastic_torch_main.py`) that logs, at the end of each epoch, the
rank-0 worker's start rank, size, host and rendezvous count, moving hosts on a discovery
schedule and killing ranks on an exit schedule. That script is not in the horovod package on
PyPI, so this is not part of the suite: give it a Horovod checkout's copy (`--main FILE`, at
the tag of the installed Horovod) and it runs the scenarios of Horovod's tests with dtlaunch
instead of horovodrun, and checks each epoch's line against what Horovod's tests expect. The
two hosts are `localhost` and `127.0.0.1` as in Horovod's tests, or with `--bed` two test-bed
hosts (h1 for localhost, h2 for 127.0.0.1), reached over ssh from inside h1.

    python bench/horovod_elastic_peer.py --main PATH/elastic_torch_main.py [--bed]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import bed_of, dtlaunch_argv, inside_h1, worktree_env, write_result

Expect = list[dict[str, Any]]
# How the two hosts of Horovod's tests are named in a run, and the command prefix and options
# that reach them (set by main for --bed).
HOSTS = {"localhost": "localhost", "127.0.0.1": "127.0.0.1"}
PREFIX: list[str] = []
REACH: list[str] = []


def named(text: str) -> str:
    for theirs, ours in HOSTS.items():
        text = text.replace(theirs, ours)
    return text


def discovery_script(folder: Path, logfile: Path, schedule: list[Any]) -> Path:
    """A script printing the schedule's hosts for the epoch the log has reached (the number of
    lines rank 0 wrote), the last entry's otherwise."""
    table = {str(epoch): [named(h) for h in hosts] for epoch, hosts in schedule
             if epoch is not None}
    default = [named(h) for h in schedule[-1][1]]
    script = folder / "discover.py"
    script.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        f"table, default = json.loads({json.dumps(json.dumps(table))}), {default!r}\n"
        f"path = {str(logfile)!r}\n"
        "epoch = str(sum(1 for _ in open(path))) if os.path.exists(path) else '0'\n"
        "print('\\n'.join(table.get(epoch, default)))\n")
    script.chmod(0o755)
    return script


def run(main: Path, schedule: list[Any] | None, *, hosts: str | None = None,
        exit_schedule: dict[str, list[int]] | None = None, exit_mode: str = "exception",
        np: int = 2, min_np: int = 2, max_np: int = 4, reset_limit: int | None = None,
        cooldown: tuple[int, int] | None = None, epoch_wait: float | None = None,
        epochs: int | None = None, timeout: float = 300) -> tuple[int, Expect, str]:
    with tempfile.TemporaryDirectory(prefix="dtl-hvd-peer-") as tmp:
        folder = Path(tmp)
        logfile = folder / "log.jsonl"
        folder.chmod(0o755)
        argv = ["run", "--no-check", *REACH, "-np", str(np), "--min-np", str(min_np)]
        if hosts is not None:
            argv += ["-H", named(hosts)]
        else:
            assert schedule is not None
            argv += ["--host-discovery-script", str(discovery_script(folder, logfile, schedule)),
                     "--max-np", str(max_np)]
        if reset_limit is not None:
            argv += ["--reset-limit", str(reset_limit)]
        if cooldown is not None:
            argv += ["--blacklist-cooldown-range", str(cooldown[0]), str(cooldown[1])]
        argv += [sys.executable, str(main), "--logfile", str(logfile)]
        if schedule:
            argv += ["--discovery-schedule", named(json.dumps(schedule))]
        if epoch_wait:
            argv += ["--epoch-wait", json.dumps(epoch_wait)]
        if epochs:
            argv += ["--epochs", json.dumps(epochs)]
        if exit_schedule:
            argv += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
        proc = subprocess.run([*PREFIX, *dtlaunch_argv(*argv)], capture_output=True, text=True,
                              timeout=timeout, env=worktree_env(), cwd=tmp)
        lines = logfile.read_text().splitlines() if logfile.exists() else []
        return proc.returncode, [json.loads(line) for line in lines], proc.stderr


def check(results: Expect, expected: list[dict[str, Any]]) -> list[str]:
    wrong = []
    if len(results) != len(expected):
        wrong.append(f"{len(results)} epochs logged, expected {len(expected)}")
    for index, (got, want) in enumerate(zip(results, expected)):
        for key, value in want.items():
            value = named(value) if isinstance(value, str) else value
            if got.get(key) != value:
                wrong.append(f"epoch {index}: {key} {got.get(key)!r}, expected {value!r}")
    return wrong


def scenarios(main: Path) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for slots, np, low, high in ((2, 2, 2, 4), (1, 1, 1, 2)):
        schedule = [[0, [f"localhost:{slots}"]],
                    [1, [f"localhost:{slots}", f"127.0.0.1:{slots}"]],
                    [None, [f"127.0.0.1:{slots}"]]]
        code, got, err = run(main, schedule, np=np, min_np=low, max_np=high)
        out.append((f"hosts added and removed ({slots} slot(s) a host)", check(got, [
            {"start_rank": 0, "size": slots, "hostname": "localhost"},
            {"start_rank": 0, "size": slots * 2, "hostname": "localhost"},
            {"start_rank": slots, "size": slots, "hostname": "127.0.0.1", "rendezvous": 3},
        ]) + ([f"exit {code}: {err[-300:]}"] if code else [])))
    failed_rank = [{"start_rank": 0, "size": 4, "rendezvous": 1},
                   {"start_rank": 2, "size": 2, "rendezvous": 2},
                   {"start_rank": 2, "size": 2, "rendezvous": 2}]
    for mode in ("exception", "kill"):
        code, got, err = run(main, [[None, ["localhost:2", "127.0.0.1:2"]]],
                             exit_schedule={str((1, 0)): [0]}, exit_mode=mode)
        out.append((f"single rank failure ({mode})", check(got, failed_rank)
                    + ([f"exit {code}: {err[-300:]}"] if code else [])))
        code, got, err = run(main, None, hosts="localhost:2,127.0.0.1:2",
                             exit_schedule={str((1, 0)): [0]}, exit_mode=mode)
        out.append((f"fault tolerance without scaling ({mode})", check(got, failed_rank)
                    + ([f"exit {code}: {err[-300:]}"] if code else [])))
    code, got, err = run(main, [[None, ["localhost:2", "127.0.0.1:2"]]],
                         exit_schedule={str((1, 0)): [0, 1, 2, 3]})
    out.append(("all ranks fail: the job fails", [] if code != 0 else ["exit 0"]))
    code, got, err = run(main, [[None, ["localhost:2", "127.0.0.1:2"]]],
                         exit_schedule={str((1, 0)): [0, 2]})
    out.append(("every host blacklisted: the job fails", [] if code != 0 else ["exit 0"]))
    moving = [[0, ["localhost:2"]], [1, ["localhost:2", "127.0.0.1:2"]],
              [None, ["127.0.0.1:2"]]]
    code, got, err = run(main, moving, reset_limit=1)
    out.append(("--reset-limit 1 stops the job", [] if code != 0 and "--reset-limit" in err
                else [f"exit {code}: {err[-300:]}"]))
    code, got, err = run(main, moving, reset_limit=2)
    out.append(("--reset-limit 2 lets it finish", check(got, [{}, {}, {}])
                + ([f"exit {code}: {err[-300:]}"] if code else [])))
    code, got, err = run(main, [[None, ["localhost:2", "127.0.0.1:2"]]],
                         exit_schedule={str((1, 0)): [3], str((3, 0)): [3]},
                         epoch_wait=0.25, epochs=5, cooldown=(1, 2))
    out.append(("blacklisted host resurrected after its cooldown", check(got, [
        {"start_rank": 0, "size": 4, "rendezvous": 1},
        {"start_rank": 0, "size": 2, "rendezvous": 2},
        {"start_rank": 0, "size": 2, "rendezvous": 2}, {},
        {"start_rank": 0, "size": 2, "rendezvous": 2},
    ]) + ([f"exit {code}: {err[-300:]}"] if code else [])))
    return out


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--main", required=True, type=Path,
                        help="Horovod's test/integration/data/elastic_torch_main.py")
    parser.add_argument("--bed", action="store_true", help="run on two test-bed hosts over ssh")
    parser.add_argument("--out", default="horovod_elastic_peer.md")
    args = parser.parse_args(argv)
    started = time.time()
    if args.bed:
        with bed_of(2, names_resolve=True) as bed:
            HOSTS.update({"localhost": "h1", "127.0.0.1": "h2"})
            PREFIX[:] = inside_h1(bed)
            REACH[:] = ["--iface", "eth0", "--ssh-config", str(bed.ssh_config)]  # type: ignore[attr-defined]
            found = scenarios(args.main)
    else:
        found = scenarios(args.main)
    where = ("two test-bed hosts, h1 and h2, over ssh from inside h1" if args.bed else
             "`localhost` and `127.0.0.1`, as in Horovod's tests")
    rows = [f"| {name} | {'passed' if not wrong else 'FAILED: ' + '; '.join(wrong)} |"
            for name, wrong in found]
    text = "\n".join([
        "## Horovod's elastic integration scenarios through dtlaunch", "",
        "Horovod 0.28.1's `test/integration/data/elastic_torch_main.py` with the discovery and "
        "exit schedules of its `elastic_common.py` tests, launched by `dtlaunch run` instead "
        f"of horovodrun, on {where}; each epoch's logged start rank, size, host and "
        "rendezvous count checked against what Horovod's tests expect.", "",
        "| scenario | result |", "|---|---|", *rows, "",
        f"{sum(not w for _, w in found)} of {len(found)} passed in "
        f"{time.time() - started:.0f} s.", ""])
    return write_result(args.out, text)


if __name__ == "__main__":
    print(main())
