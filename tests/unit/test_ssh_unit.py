"""SSH failure classification with real sockets on 127.0.0.1, config resolution, known_hosts."""

from __future__ import annotations

import socket
import threading
import time

import paramiko
import pytest
from helpers.procs import HANG

from dtlaunch import ssh
from dtlaunch.reach import known_hosts, ssh_config, ssh_errors
from dtlaunch.reach import proxy as ssh_proxy
from dtlaunch.reach.ssh_errors import SshFailure
from dtlaunch.reach.ssh_options import SshOptions
from dtlaunch.reach.target import SshTarget


def target(port: int, host: str = "127.0.0.1", timeout: float = 1.0, **kw: object) -> SshTarget:
    return SshTarget(alias="node", hostname=host, port=port, user="me",
                         connect_timeout=timeout, **kw)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_closed_port_is_refused():
    with pytest.raises(SshFailure) as info:
        ssh.connect(target(free_port()))
    assert info.value.kind == ssh_errors.REFUSED
    assert "start sshd" in info.value.hint


def test_silent_listener_is_a_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    try:
        start = time.monotonic()
        with pytest.raises(SshFailure) as info:
            ssh.connect(target(listener.getsockname()[1], timeout=0.5))
        assert info.value.kind == ssh_errors.TIMEOUT
        assert time.monotonic() - start < HANG  # ended by the timeout, not by the listener
    finally:
        listener.close()


def test_not_ssh_server():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)

    def answer() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(SshFailure) as info:
            ssh.connect(target(listener.getsockname()[1], timeout=2))
        assert info.value.kind in (ssh_errors.PROTOCOL, ssh_errors.TIMEOUT)
    finally:
        listener.close()


def test_unresolvable_name():
    with pytest.raises(SshFailure) as info:
        ssh.connect(target(22, host="no-such-host.invalid"))
    assert info.value.kind == ssh_errors.UNRESOLVED
    assert "HostName" in info.value.hint


def test_proxy_command_that_dies_is_a_proxy_failure():
    t = target(22, proxy_command="sh -c 'echo boom >&2; exit 3'")
    with pytest.raises(SshFailure) as info:
        ssh.connect(t)
    assert info.value.kind == ssh_errors.PROXY
    assert "boom" in info.value.detail


def test_resolve_target_from_config(tmp_path):
    config_file = tmp_path / "config"
    config_file.write_text(
        "Host n1\n  HostName 10.0.0.5\n  User alice\n  Port 2222\n  IdentityFile ~/k1\n"
        "  IdentitiesOnly yes\n  UserKnownHostsFile /tmp/kh1 /tmp/kh2\n"
        "  ProxyCommand sh -c 'sleep 0.2; exec nc %h %p'\n"
        "Host n2\n  ProxyJump jump1,jump2\n")
    config = ssh_config.load_ssh_config(str(config_file))
    t = ssh_config.resolve_target("n1", SshOptions(identity_file="/keys/id"), config)
    assert (t.hostname, t.user, t.port, t.identities_only) == ("10.0.0.5", "alice", 2222, True)
    assert t.identity_files[0] == "/keys/id" and t.identity_files[1].endswith("/k1")
    assert t.known_hosts_files == ("/tmp/kh1", "/tmp/kh2")
    assert t.known_hosts_name == "[10.0.0.5]:2222"
    assert ssh_proxy.proxy_argv(t) == ("sh", "-c", "sleep 0.2; exec nc 10.0.0.5 2222")
    t2 = ssh_config.resolve_target("n2", SshOptions(port=2200, config_file=str(config_file)), config)
    argv = ssh_proxy.proxy_argv(t2)
    assert argv is not None and argv[-3:] == ("[n2]:2200", "--", "jump2")
    assert "-J" in argv and "jump1" in argv


def test_host_key_verdicts(tmp_path):
    key = paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path, "a")))
    other = paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path, "b")))
    known_file = tmp_path / "known_hosts"
    t = target(22, known_hosts_files=(str(known_file),), global_known_hosts_files=())
    assert known_hosts.known_keys(t) == {}
    assert known_hosts.check_host_key(t, key, {}) == "unknown"
    path = known_hosts.append_known_host(t, key)
    assert path == str(known_file) and (known_file.stat().st_mode & 0o777) == 0o600
    known = known_hosts.known_keys(t)
    assert known_hosts.check_host_key(t, key, known) == "ok"
    assert known_hosts.check_host_key(t, other, known) == "changed"


def test_preferred_key_types_put_known_first():
    available = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
    assert known_hosts.preferred_host_key_types({"ssh-rsa": None}, available)[:2] == (
        "rsa-sha2-512", "rsa-sha2-256")
    assert known_hosts.preferred_host_key_types({}, available) == available


def test_changed_key_hint_warns_of_mitm():
    hint = ssh_errors.hint_for(ssh_errors.CHANGED_HOST_KEY, target(2222))
    assert "MAN-IN-THE-MIDDLE" in hint and "ssh-keygen -R" in hint


def _keygen(tmp_path, name: str):
    import subprocess

    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_paramiko_is_imported_without_invoke_unless_a_config_needs_match_exec(tmp_path):
    import subprocess
    import sys

    plain = tmp_path / "plain"
    plain.write_text("Host node\n  HostName 10.0.0.1\n")
    with_exec = tmp_path / "exec"
    with_exec.write_text("Host node\n  HostName 10.0.0.1\nMatch exec \"true\"\n  User bob\n")
    code = (
        "import sys\n"
        "from dtlaunch.reach.ssh_config import load_ssh_config\n"
        "entry = load_ssh_config(sys.argv[1]).lookup('node')\n"
        "print('invoke' in sys.modules, entry.get('user'), entry['hostname'])\n"
    )
    first = subprocess.run([sys.executable, "-c", code, str(plain)], capture_output=True, text=True)
    assert first.stdout.split() == ["False", "None", "10.0.0.1"], first.stderr
    second = subprocess.run([sys.executable, "-c", code, str(with_exec)], capture_output=True, text=True)
    assert second.stdout.split() == ["True", "bob", "10.0.0.1"], second.stderr
