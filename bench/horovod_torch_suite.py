"""Horovod's own parallel torch suite (`test/parallel/test_torch.py`) under `dtlaunch run
--gloo` on 2 test-bed hosts, as Horovod's CI runs it under `horovodrun --gloo`, with horovodrun
in the same run for comparison.

The suite is not in the horovod package on PyPI: give a Horovod checkout's `test/` folder at
the installed Horovod's tag (`--tests DIR`, holding `parallel/test_torch.py` and
`utils/common.py`; its helpers need `pip install mock`). Each rank writes a JUnit XML file; the counts of passed, failed, errored
and skipped tests per rank are compared between the launchers.

    python bench/horovod_torch_suite.py --tests PATH/test [--k EXPR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from common import (
    PYTHON,
    dtlaunch_argv,
    horovodrun_env,
    horovodrun_path,
    md_table,
    resolving_bed,
    timed,
    worktree_env,
    write_result,
)


def counts(folder: Path) -> dict[str, dict[str, int]]:
    """rank file -> {tests, failures, errors, skipped}."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(folder.glob("rank*.xml")):
        suite = ET.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
        assert suite is not None
        out[path.stem] = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors",
                                                               "skipped")}
    return out


def failed_names(folder: Path) -> set[str]:
    names = set()
    for path in folder.glob("rank*.xml"):
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                names.add(case.get("name", "?"))
    return names


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tests", required=True, type=Path, help="a Horovod checkout's test/")
    parser.add_argument("--k", default="", help="pytest -k expression (default: every test)")
    parser.add_argument("--out", default="horovod_torch_suite.md")
    args = parser.parse_args(argv)
    results = {}
    with resolving_bed(2) as (bed, wrap, inside), tempfile.TemporaryDirectory(
            prefix="dtl-hvd-suite-") as tmp:
        tests = Path(tmp) / "test"
        shutil.copytree(args.tests, tests)
        os.chmod(tmp, 0o755)
        env = worktree_env()
        hvd_env = horovodrun_env(env, wrap)
        # Each rank its own JUnit file: the rank number is in HOROVOD_RANK there.
        runner = tests / "run_rank.sh"
        runner.write_text(
            "#!/bin/sh\ncd \"$(dirname \"$0\")/parallel\"\n"
            f"exec {PYTHON} -m pytest -q -p no:cacheprovider "
            + (f"-k '{args.k}' " if args.k else "")
            + "--junitxml=\"$OUT/rank$HOROVOD_RANK.xml\" test_torch.py\n")
        runner.chmod(0o755)
        tools = {"dtlaunch run --gloo": (inside + dtlaunch_argv(
            "run", "--gloo", "--no-check", "--iface", "eth0", "--ssh-config",
            str(bed.ssh_config), "-H", "h1:1,h2:1", "-x", "OUT", str(runner)), env)}
        hvdrun = horovodrun_path()
        if hvdrun:
            addrs = ",".join(f"{h.address}:1" for h in bed.hosts)
            tools["horovodrun --gloo"] = ([*inside, hvdrun, "--gloo", "-np", "2", "-H", addrs, "--network-interface", "eth0", str(runner)], hvd_env)
        for name, (command, e) in tools.items():
            out = Path(tmp) / name.split()[0]
            out.mkdir()
            os.chmod(out, 0o777)
            started = time.time()
            sample = timed(command, env={**e, "OUT": str(out)}, timeout=3600, cwd="/tmp",
                           check=False)
            results[name] = {"seconds": time.time() - started, "code": sample.returncode,
                             "counts": counts(out), "failed": sorted(failed_names(out)),
                             "tail": (sample.stdout + sample.stderr)[-1500:]}
    rows = []
    for name, res in results.items():
        for rank, c in res["counts"].items():  # type: ignore[union-attr]
            rows.append([name, rank, c["tests"], c["tests"] - c["failures"] - c["errors"]
                         - c["skipped"], c["failures"] + c["errors"], c["skipped"],
                         f"{res['seconds']:.0f}", res["code"]])
    for name, res in results.items():
        if not res["counts"]:  # no rank wrote its report: say what the launcher said
            rows.append([name, "-", "-", "-", "-", "-", f"{res['seconds']:.0f}", res["code"]])
            print(f"{name}: no report; its last output:\n{res['tail']}")
    base = results.get("horovodrun --gloo", {}).get("failed", [])
    ours = results.get("dtlaunch run --gloo", {}).get("failed", [])
    text = "\n".join([
        "## Horovod's parallel torch suite over Gloo, 2 test-bed hosts", "",
        md_table(["launcher", "rank", "tests", "passed", "failed", "skipped", "wall s",
                  "exit"], rows), "",
        f"Failed under dtlaunch only: {sorted(set(ours) - set(base)) or 'none'}; under "
        f"horovodrun only: {sorted(set(base) - set(ours)) or 'none'}; under both: "
        f"{sorted(set(ours) & set(base)) or 'none'}.", ""])
    return write_result(args.out, text)


if __name__ == "__main__":
    print(main())
