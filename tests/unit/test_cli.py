"""The CLI as a user meets it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.suite import dtlaunch_argv


def dtl(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtlaunch_argv(*args), capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=60)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


def test_done_when_dry_run_line(script: Path) -> None:
    result = dtl("run", "--dry-run", "-H", "host1:1,host2:1", "--iface", "ens3", "train.py",
                 cwd=script.parent)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    line = result.stdout
    assert argv[argv.index("-np") + 1] == "2"
    assert argv[argv.index("-H") + 1] == "host1:1,host2:1"
    for piece in (" --bind-to none ", " --map-by slot ", "--mca btl_tcp_if_include ens3",
                  "oob_tcp_if_include ens3", "NCCL_SOCKET_IFNAME=ens3"):
        assert piece in line
    assert argv[-2:] == [sys.executable, "train.py"]
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)


def test_dry_run_masks_secrets_and_never_prints_values(script: Path) -> None:
    env = {**os.environ, "MY_TOKEN": "s3cr3t-value", "AWS_SECRET_ACCESS_KEY": "aws-s3cr3t"}
    result = dtl("run", "--dry-run", "-H", "h1", "-x", "MY_TOKEN", "-x", "DB_PASSWORD=pw-s3cr3t",
                 str(script), env=env)
    assert result.returncode == 0
    assert "s3cr3t" not in result.stdout + result.stderr
    argv = shlex.split(result.stdout)
    assert "MY_TOKEN" in argv and "DB_PASSWORD" in argv
    assert "AWS_SECRET_ACCESS_KEY" not in result.stdout
    assert result.stderr.count("looks like a secret") == 2


def test_a_typed_secret_value_is_warned_about_once_and_kept_off_mpiruns_line(
        script: Path, tmp_path: Path) -> None:
    result = dtl("run", "--dry-run", "-H", "h1", "-x", "AWS_SECRET_ACCESS_KEY=aws-s3cr3t",
                 str(script))
    assert result.returncode == 0, result.stderr
    assert "s3cr3t" not in result.stdout + result.stderr
    assert "AWS_SECRET_ACCESS_KEY" in shlex.split(result.stdout)  # -x NAME: by name only
    warned = [line for line in result.stderr.splitlines() if "AWS_SECRET_ACCESS_KEY" in line]
    assert len(warned) == 1 and warned[0].startswith("dtlaunch: warning: ")
    assert "typed on the command line" in warned[0] and "--env-file" in warned[0]
    env_file = tmp_path / "secrets.env"
    env_file.write_text("AWS_SECRET_ACCESS_KEY=aws-s3cr3t\n")
    result = dtl("run", "--dry-run", "-H", "h1", "--env-file", str(env_file), str(script))
    assert result.returncode == 0 and "s3cr3t" not in result.stdout + result.stderr
    assert "looks like a secret" in result.stderr and "typed on" not in result.stderr


def test_module_mode(script: Path) -> None:
    result = dtl("run", "--dry-run", "-np", "2", "-m", "dtlaunch.examples.ptb_lm", "--config", "small")
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout)[-5:] == [sys.executable, "-m", "dtlaunch.examples.ptb_lm",
                                               "--config", "small"]



def test_horovodrun_options_and_spellings_reach_the_mpirun_line(script: Path) -> None:
    config = script.parent / "horovod.yaml"
    config.write_text("params:\n  fusion_threshold_mb: 8\n  cycle_time_ms: 2\n")
    result = dtl("run", "--dry-run", "-hostfile", str(_hostfile(script)), "-p", "2222",
                 "--network-interface", "ens3", "--config-file", str(config),
                 "--fusion-threshold-mb", "32", "--timeline", "t.json", "--tcp",
                 "--binding-args", "--bind-to core --map-by socket",
                 "python", "train.py", "--lr", "1", cwd=script.parent)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("-H") + 1] == "h1:2,h2:2"
    # dtlaunch's ssh wrapper gets the ssh options in its environment, never on a command line
    # that a remote shell reads.
    assert "plm_rsh_args" not in argv
    name, _, value = argv[0].partition("=")
    assert name == "DTLAUNCH_SSH_ARGS"
    options = json.loads(value)
    assert options[options.index("-p"):][:2] == ["-p", "2222"]
    assert argv[argv.index("btl_tcp_if_include") + 1] == "ens3"
    for var in ("HOROVOD_FUSION_THRESHOLD=33554432", "HOROVOD_CYCLE_TIME=2",
                "HOROVOD_TIMELINE=t.json", "NCCL_IB_DISABLE=1"):  # a flag beats the file
        assert var in argv
    bind = argv.index("--bind-to")
    assert argv[bind:bind + 4] == ["--bind-to", "core", "--map-by", "socket"]
    assert "none" not in argv[bind:bind + 4]
    assert argv[-4:] == ["python", "train.py", "--lr", "1"]  # horovodrun's form, as given


def _hostfile(script: Path) -> Path:
    path = script.parent / "hosts.txt"
    path.write_text("h1 slots=2\nh2:2\n")
    return path


@pytest.mark.parametrize(("words", "tail"), [
    (["bash", "run.sh", "--x"], ["bash", "run.sh", "--x"]),
    (["numactl", "--interleave=all", "python3", "train.py"],
     ["numactl", "--interleave=all", "python3", "train.py"]),
    (["train.py", "a"], [sys.executable, "train.py", "a"]),
])
def test_command_forms(script: Path, words: list[str], tail: list[str]) -> None:
    result = dtl("run", "--dry-run", "-H", "h1,h2", *words, cwd=script.parent)
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout)[-len(tail):] == tail


def test_env_file_and_the_kept_home_note(script: Path) -> None:
    env_file = script.parent / "job.env"
    env_file.write_text("# for the job\nDATA_DIR=/data\nLR=0.1\n")
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    env.pop("TF_CLI_CONFIG_FILE", None)
    result = dtl("run", "--dry-run", "-H", "h1", "--env-file", str(env_file), "-x", "LR=0.2",
                 str(script), env=env)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert "DATA_DIR=/data" in argv and "LR=0.2" in argv and "LR=0.1" not in argv
    notes = [line for line in result.stderr.splitlines() if "not sent to the ranks" in line]
    assert len(notes) == 1 and "PYTORCH_CUDA_ALLOC_CONF" in notes[0]
    assert "expandable_segments" not in result.stderr  # names only, never values


def test_check_build_prints_horovods_build_without_a_command() -> None:
    pytest.importorskip("horovod")
    result = dtl("run", "--check-build")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Horovod v") and "[X] PyTorch" in result.stdout
    assert "Available Controllers:" in result.stdout


def test_check_build_reports_the_horovod_of_the_jobs_python(tmp_path: Path) -> None:
    # An interpreter with no Horovod: a venv without site-packages of its own kind.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    python = str(bare / "bin" / "python")
    result = dtl("run", "--check-build", "--python", python)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"dtlaunch: error: --check-build: horovod is not installed "
                                     f"for {python}; see dtlaunch install-horovod")


def test_run_help_lists_horovodrun_options() -> None:
    result = dtl("run", "--help")
    assert result.returncode == 0
    for flag in ("--fusion-threshold-mb", "--config-file", "--env-file", "-hostfile",
                 "--network-interface", "--check-build"):
        assert flag in result.stdout

BAD_RUN = [
    (["-H", "host1:x"], "slots must be a positive whole number"),
    (["-H", ":2"], "empty host name"),
    (["-H", "host1:0"], "at least 1"),
    (["-H", "host1:-1"], "positive whole number"),
    (["-H", ""], "empty host list"),
    (["-H", "a,a"], "more than once"),
    (["-H", "fe80::1"], "IPv6"),
    (["-H", "a:100000"], "more than the 4096"),
    (["-H", "a", "-H", "b"], "given more than once"),
    (["-H", "a", "--hostfile", "{tmp}/hosts"], "not both"),
    (["--hostfile", "{tmp}/missing"], "cannot read"),
    (["--hostfile", "{tmp}/junk"], "junk:2: unexpected"),
    (["--hostfile", "{tmp}/binary"], "not valid UTF-8"),
    (["-np", "0", "-H", "a"], "at least 1"),
    (["-np", "3", "-H", "a:2"], "only 2 slots"),
    (["-np", "2000000", "-H", "a", "--oversubscribe"], "more than the 1000000 dtlaunch starts"),
    (["-np", "1000000000", "--oversubscribe"], "1000000000 processes is more than the 1000000"),
    (["--output-dir", ""], "--output-dir: empty path"),
    (["-H", ",".join(f"h{i}:4096" for i in range(300))], "all 1228800 slots is more than"),
    (["--output-dir", "{tmp}/hosts"], "{tmp}/hosts exists and is not a directory"),
    (["--output-dir", "{tmp}/hosts/logs"], "which is not a directory"),
    (["--output-filename", "{tmp}/hosts"], "--output-filename: {tmp}/hosts exists and is not"),
    (["-np", "x"], "'x' is not a valid integer"),
    (["-x", "A-B"], "invalid variable name"),
    (["-x", "BASH_FUNC_x%%=1"], "invalid variable name"),
    (["-x", "NOT_SET_ANYWHERE_1"], "not set here"),
    (["--mpi-args", "'unbalanced"], "cannot split"),
    (["--iface", "eth0,10.0.0.0/8"], "not both"),
    (["--iface", "10.0.0.0/99"], "invalid CIDR"),
    (["--ssh-port", "0"], "0 is not in the range"),
    (["--ssh-identity-file", "{tmp}/nokey"], "no such file"),
    (["--timeout", "-1"], "-1"),
    (["--python", "relative/python"], "not an absolute path"),
    (["--no-such-flag"], "unknown option --no-such-flag"),
    # horovodrun's options and spellings
    (["--iface", "eth0", "--network-interface", "eth1"], "name the same thing"),
    (["--output-dir", "d", "--output-filename", "e"], "name the same thing"),
    (["--gloo", "--mpi"], "--mpi and --gloo contradict each other"),
    (["--gloo", "--mpi-args", "-v"], "--mpi-args: no MPI launcher runs under --gloo"),
    (["--min-num-proc", "2"], "elastic mode"),
    (["--fusion-threshold-mb", "x"], "'x' is not a valid integer"),
    (["--fusion-threshold-mb", "1", "--fusion-threshold-mb", "2"], "given more than once"),
    (["--hierarchical-allreduce", "--no-hierarchical-allreduce"], "contradict each other"),
    (["--log-level", "loud"], "expected one of TRACE"),
    (["--start-timeout", "0"], "between 1 second and a day"),
    (["--start-timeout", "9" * 40], "between 1 second and a day"),
    (["--config-file", "{tmp}/bad.yaml"], "bad.yaml:3:1: malformed YAML"),
    (["--config-file", "{tmp}/typo.yaml"], "typo.yaml:2:18: params.cycle_time_ms: expected a number"),
    (["--config-file", "{tmp}/missing.yaml"], "--config-file: cannot read"),
    (["--binding-args", "-map-by node"], "spreads ranks across hosts"),
    (["--binding-args", "-H a"], "dtlaunch sets the hosts"),
    (["--timeline", "a", "--timeline-filename", "b"], "given more than once"),
    (["-p", "0"], "0 is not in the range"),
    (["-i", "{tmp}/nokey"], "no such file"),
    (["-hostfile", "{tmp}/missing"], "cannot read"),
    (["--env-file", "{tmp}/missing"], "--env-file: cannot read"),
    (["--env-file", "{tmp}/junk"], "junk:1: invalid variable name"),
    (["--env-file", "{tmp}/hosts", "--env-file", "{tmp}/hosts"], "given more than once"),
    (["--python", sys.executable, "python"], "the command names its interpreter"),
    # issue 27: a directory given as a file is one line, as a FIFO is
    (["--config-file", "{tmp}"], "--config-file: {tmp} is a directory, not a regular file"),
    (["--env-file", "{tmp}"], "--env-file: {tmp} is a directory, not a regular file"),
    (["--hostfile", "{tmp}"], "--hostfile: {tmp} is a directory, not a regular file"),
    (["--ssh-config", "{tmp}"], "--ssh-config: {tmp} is a directory, not a regular file"),
    (["-i", "{tmp}"], "--ssh-identity-file: {tmp} is a directory, not a regular file"),
    (["--ssh-config", "{tmp}/fifo"], "{tmp}/fifo is a FIFO, not a regular file"),
    (["-i", "/dev/null"], "/dev/null is a character device"),
    # issue 27: the dry run refuses what the real run refuses
    (["--max-restarts", "-1", "-H", "a"], "--max-restarts: must be between 0 and 1000, got -1"),
    (["--max-restarts", "1", "--min-np", "3", "-H", "a,b"],
     "--min-np 3 is more than the job's 2 processes"),
    (["--max-restarts", "1", "--min-np", "0", "-H", "a"], "--min-np: must be at least 1"),
    # issue 27: absurd tunables, on the command line and in the config file
    (["--fusion-threshold-mb", "99999999999999999999"],
     "--fusion-threshold-mb: must be at most 1048576 MiB (1 TiB), got 99999999999999999999"),
    (["--cache-capacity", "99999999999999999999"], "--cache-capacity: must be at most 10000000"),
    (["--cycle-time-ms", "1e300"], "--cycle-time-ms: must be at most 3600000 ms"),
    (["--config-file", "{tmp}/huge.yaml"],
     "huge.yaml:2:19: params.cache_capacity: must be at most 10000000"),
    # issue 27: env files name their line, drop a BOM, refuse an unclosed quote
    (["--env-file", "{tmp}/unset.env"], "unset.env:2: NOT_SET_ANYWHERE_2 is not set here"),
    (["--env-file", "{tmp}/bom.env"], "bom.env:2: the value of Q opens a \" quote"),
    # issue 26: the console filter (and torchrun's spelling of it), --json
    (["--ranks", "1-0"], "--ranks '1-0': the range 1-0 runs backwards"),
    (["--ranks", "first"], "--ranks 'first': 'first' is not a rank, a range A-B, 'last' or 'all'"),
    (["--ranks", ""], "--ranks '': expected ranks like 0 or 0,3-5 or last or all"),
    (["--ranks", "0,,2"], "expected ranks like"),
    (["--ranks", "0", "--ranks", "1"], "given more than once"),
    (["--local_ranks_filter", "a"], "--local-ranks-filter 'a': 'a' is not a rank"),
    (["--ranks", "0", "--local-ranks-filter", "0"], "both pick the ranks shown; give one"),
    (["--json", "--max-restarts", "1", "-H", "a"], "--json goes without --max-restarts"),
    (["--json"], "--json reports how a job ended; --dry-run starts none"),
]


@pytest.mark.parametrize(("args", "message"), BAD_RUN)
def test_bad_run_input(args: list[str], message: str | None, script: Path, tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("a\n")
    (tmp_path / "junk").write_text("a slots=1\nb !!!\n")
    (tmp_path / "binary").write_bytes(b"a\n\xff\n")
    (tmp_path / "bad.yaml").write_text("params:\n  fusion_threshold_mb: [1\n")
    (tmp_path / "typo.yaml").write_text("params:\n  cycle_time_ms: '1'\n")  # a string
    (tmp_path / "huge.yaml").write_text("params:\n  cache_capacity: 99999999999999999999\n")
    (tmp_path / "unset.env").write_text("A=1\nNOT_SET_ANYWHERE_2\n")
    (tmp_path / "bom.env").write_bytes('\ufeffP3A=1\nQ="abc\n'.encode())
    os.mkfifo(tmp_path / "fifo")
    full = [a.format(tmp=tmp_path) for a in args]
    result = dtl("run", "--dry-run", *full, str(script))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtlaunch: error: ")
    if message:
        assert message.format(tmp=tmp_path) in lines[0]


def test_more_processes_than_cores_here_needs_oversubscribe(script: Path) -> None:
    cores = os.cpu_count() or 1
    result = dtl("run", "--dry-run", "-np", str(cores + 1), str(script))
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f"dtlaunch: error: -np: {cores + 1} processes but this machine has only {cores} cores "
        "(one slot each without -H); pass --oversubscribe to run more processes than cores")
    result = dtl("run", "--dry-run", "-np", str(cores + 1), "--oversubscribe", str(script))
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[argv.index("-np") + 1] == str(cores + 1)
    assert argv[argv.index("-H") + 1] == f"localhost:{cores}" and "--oversubscribe" in argv


def test_an_output_dir_that_is_a_file_is_refused_before_the_preflight(script: Path,
                                                                       tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    result = dtl("run", "-H", "no-such-host.invalid", "--output-dir", str(taken), str(script))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"dtlaunch: error: --output-dir: {taken} exists and is not a directory"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "missing the command"),
        (["run", "no_such_script.py"], "script not found"),
        (["run", "-m", "bad-module!"], "not a valid module name"),
        (["run", "-m", "1x"], "not a valid module name"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_bad_program(args: list[str], message: str, tmp_path: Path) -> None:
    result = dtl(*args, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_no_mpirun_on_path(script: Path) -> None:
    env = {**os.environ, "PATH": "/nonexistent"}
    result = dtl("run", "-H", "a", str(script), env=env)
    assert result.returncode == 2
    assert "mpirun not found on PATH" in result.stderr and "apt-get install openmpi-bin" in result.stderr


def test_help_and_version() -> None:
    assert dtl("--help").returncode == 0
    assert "dtlaunch" in dtl("--version").stdout
    assert subprocess.run([sys.executable, "-m", "dtlaunch", "run", "--help"],
                          capture_output=True, text=True).returncode == 0


BAD_OTHER = [
    (["doctor", "-H", "a:x"], "slots must be a positive whole number"),
    (["doctor", "-H", "a", "--hostfile", "{tmp}/hosts"], "not both"),
    (["doctor", "--hostfile", "{tmp}/junk"], "junk:2: unexpected"),
    (["doctor", "-H", "a", "--iface", "10.0.0.0/40"], "invalid CIDR"),
    (["doctor", "-H", "a", "-m", "bad-mod"], "not a valid module name"),
    (["doctor", "-H", "a", "--timeout", "0"], "not in the range"),
    (["doctor", "-H", "a", "--timeout", "inf"], "not a finite number of seconds"),
    (["doctor", "-H", "a", "--timeout", "nan"], "not a finite number of seconds"),
    (["run", "--dry-run", "--timeout", "nan", "-H", "a", "{tmp}/hosts"], "not a finite number"),
    (["doctor", "-H", "a", "--timeout", "1e300"], "not in the range 0<x<=31622400"),
    (["run", "--dry-run", "--timeout", "1e300", "-H", "a", "{tmp}/hosts"], "not in the range"),
    (["run", "--dry-run", "--timeout", "-0.5", "-H", "a", "{tmp}/hosts"], "not in the range"),
    (["doctor", "-H", "a", "--ssh-config", "{tmp}/missing"], "no such file"),
    (["doctor", "--hostfile", "{tmp}"], "--hostfile: {tmp} is a directory, not a regular file"),
    (["doctor", "-H", "a", "--ssh-config", "{tmp}"], "{tmp} is a directory"),
    (["doctor", "-H", "a", "-H", "b"], "given more than once"),
    (["doctor", "-H", "a,a"], "more than once"),
    (["doctor", "-H", "a", "--iface", "eth\n0"], "invalid interface name"),
    (["doctor", "-H", "\udcff\udcfe"], "invalid host name"),
    (["env-check", "--bogus"], "No such option"),
    (["env-check", "extra"], "unexpected extra argument"),
    (["run", "--dry-run", "-x", "A\udcff=1", "-H", "a", "{tmp}/hosts"], "invalid variable name"),
]


@pytest.mark.parametrize(("args", "message"), BAD_OTHER)
def test_bad_doctor_and_env_check_input(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("a\n")
    (tmp_path / "junk").write_text("a slots=1\nb !!!\n")
    full = [a.format(tmp=tmp_path) for a in args]
    result = subprocess.run(dtlaunch_argv(*full), capture_output=True, timeout=60)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtlaunch: error: ")
    assert message.format(tmp=tmp_path) in lines[0]
    assert "Traceback" not in stderr


def test_prefix_output_with_timestamp_is_taken(script: Path) -> None:
    result = dtl("run", "--dry-run", "--prefix-output-with-timestamp", "-H", "h1", str(script))
    assert result.returncode == 0, result.stderr


def test_a_bom_starts_an_env_file_without_joining_its_first_name(script: Path,
                                                                 tmp_path: Path) -> None:
    env_file = tmp_path / "bom.env"
    env_file.write_bytes("\ufeffP3A=abc\n".encode())
    result = dtl("run", "--dry-run", "-H", "h1", "--env-file", str(env_file), str(script))
    assert result.returncode == 0, result.stderr
    assert "P3A=abc" in shlex.split(result.stdout)


def test_ssh_config_dev_null_means_no_config_file(script: Path) -> None:
    """`ssh -F /dev/null` is how one ignores ~/.ssh/config; --ssh-config takes it too."""
    result = dtl("run", "--dry-run", "-H", "h1", "--ssh-config", "/dev/null", str(script))
    assert result.returncode == 0, result.stderr
    assert '"-F", "/dev/null"' in result.stdout
