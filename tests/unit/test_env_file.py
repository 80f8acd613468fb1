"""--env-file, the one-line note about training variables kept home, and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.core.errors import UsageError
from dtlaunch.job.env import (
    build_launcher_env,
    kept_home,
    kept_home_note,
    merge_env_items,
    parse_env_file_text,
    plan_environment,
    read_env_file,
)
from dtlaunch.job.hosts import Host
from dtlaunch.openmpi.family import OPEN_MPI
from dtlaunch.plan.plan import RunRequest, plan_run

ENV_FILE = """\
# NCCL tuning
NCCL_DEBUG=INFO

export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
DATA_DIR="/data/imagenet train"
QUOTE='it''s'
EMPTY=
EQUALS=a=b==c
   SPACED=  kept as is
HOME
"""


def test_env_file_lines() -> None:
    items = parse_env_file_text(ENV_FILE, "job.env", {"HOME": "/root"})
    assert items == ("NCCL_DEBUG=INFO", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                     "DATA_DIR=/data/imagenet train", "QUOTE=it''s", "EMPTY=", "EQUALS=a=b==c",
                     "SPACED=  kept as is", "HOME")
    plan = plan_environment({"HOME": "/root"}, items)
    values = {v.name: v.value for v in plan.variables}
    assert values["DATA_DIR"] == "/data/imagenet train" and values["HOME"] == "/root"


@pytest.mark.parametrize(("text", "message"), [
    ("A=1\nnot a line\n", r"job.env:2: expected NAME=VALUE, got 'not a line'"),
    ("1X=2\n", r"job.env:1: invalid variable name '1X'"),
    ("A B=1\n", r"job.env:1: invalid variable name 'A B'"),
    ("=1\n", r"job.env:1: invalid variable name ''"),
    ("A=1\n# c\nA=2\n", r"job.env:3: A is already set on line 1"),
    ("NOT_SET_HERE\n", r"job.env:1: NOT_SET_HERE is not set here; give it as NOT_SET_HERE=VALUE"),
    ('A=1\nP3A="abc\n', r'job.env:2: the value of P3A opens a " quote that the line does not close'),
    ("P3A='abc\n", r"job.env:1: the value of P3A opens a ' quote"),
    ('P3A="\n', r"job.env:1: the value of P3A opens a \" quote"),
    ("\ufeff\ufeffA=1\n", r"job.env:1: invalid variable name '\\ufeffA'"),  # only one BOM goes
])
def test_bad_env_files(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_env_file_text(text, "job.env", {})
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_a_byte_order_mark_is_not_part_of_the_first_name(tmp_path: Path) -> None:
    path = tmp_path / "job.env"
    path.write_bytes("\ufeffP3A=1\nB='x y'\n".encode())
    assert read_env_file(str(path)) == ("P3A=1", "B=x y")


def test_reading_env_files(tmp_path: Path) -> None:
    path = tmp_path / "job.env"
    path.write_text("A=1\n")
    assert read_env_file(str(path)) == ("A=1",)
    with pytest.raises(UsageError, match="cannot read"):
        read_env_file(str(tmp_path / "missing.env"))
    path.write_bytes(b"A=1\nB=\xff\n")
    with pytest.raises(UsageError, match=r"job.env:2: not valid UTF-8"):
        read_env_file(str(path))
    path.write_bytes(b"A=1\x00")
    with pytest.raises(UsageError, match="binary"):
        read_env_file(str(path))


def test_flags_beat_the_file() -> None:
    assert merge_env_items(("A=1", "B=2", "C"), ("B=3", "D=4")) == ("A=1", "C", "B=3", "D=4")


SAFE_VALUE = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20).filter(
    lambda v: v == v.strip() and v[:1] not in ("'", '"'))


@given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), SAFE_VALUE, max_size=6))
def test_env_file_round_trip(pairs: dict[str, str]) -> None:
    text = "".join(f"{k}={v}\n" for k, v in pairs.items())
    assert parse_env_file_text(text) == tuple(f"{k}={v}" for k, v in pairs.items())


def test_kept_home_note() -> None:
    environ = {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "x", "UCX_TLS": "tcp", "FI_PROVIDER": "efa",
               "TF_CPP_MIN_LOG_LEVEL": "2", "MY_APP": "1", "WANDB_API_KEY": "s3cret",
               "OMP_PROC_BIND": "true", "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0",
               "OMPI_MCA_btl": "tcp"}
    plan = plan_environment(environ, ("UCX_TLS",))
    assert kept_home(environ, plan) == ("FI_PROVIDER", "OMP_PROC_BIND", "PYTORCH_CUDA_ALLOC_CONF",
                                        "TF_CPP_MIN_LOG_LEVEL")
    assert kept_home_note(environ, plan, limit=3) == (
        "not sent to the ranks (not on the allow-list): FI_PROVIDER, OMP_PROC_BIND, "
        "PYTORCH_CUDA_ALLOC_CONF and 1 more; send them with -x NAME or --env-file FILE")
    assert kept_home_note({"PATH": "/bin"}, plan_environment({"PATH": "/bin"})) is None


def test_cuda_visible_devices_stays_on_the_launcher() -> None:
    environ = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "GPU-5e2c6e36-8c3a", "HOME": "/root"}
    plan = plan_run(RunRequest(hosts=(Host("h1", 2), Host("h2", 2)), python="python3",
                               script="train.py"), environ, family=OPEN_MPI)
    # Not exported to other hosts; mpirun keeps it, so ranks it starts on this machine see it.
    assert "CUDA_VISIBLE_DEVICES" not in plan.env.names()
    assert not any("CUDA_VISIBLE_DEVICES" in a for a in plan.argv)
    assert plan.launcher_env["CUDA_VISIBLE_DEVICES"] == "GPU-5e2c6e36-8c3a"
    # Named explicitly, it goes to every rank: the user asked for it.
    named = plan_environment(environ, ("CUDA_VISIBLE_DEVICES=0",))
    assert "CUDA_VISIBLE_DEVICES" in named.names()
    assert build_launcher_env(environ, named)["CUDA_VISIBLE_DEVICES"] == "0"
