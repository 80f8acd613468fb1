from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtlaunch.core.errors import UsageError
from dtlaunch.job.env import build_launcher_env, looks_secret, plan_environment

ENV = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "HOROVOD_FUSION_THRESHOLD": "1",
    "NCCL_DEBUG": "INFO",
    "AWS_SECRET_ACCESS_KEY": "hunter2",
    "HOROVOD_API_TOKEN": "tok",
    "MY_VAR": "x",
    "BASH_FUNC_x%%": "() { :; }",
    "OMPI_MCA_btl_base_verbose": "0",
}


def test_allow_list_only_and_no_secrets() -> None:
    plan = plan_environment(ENV)
    assert plan.names() == ("HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "PATH")
    assert not plan.warnings


def test_named_variables_and_values() -> None:
    plan = plan_environment(ENV, ["MY_VAR", "NEW=a=b c"], {"NCCL_SOCKET_IFNAME": "eth0"})
    by_name = {v.name: v for v in plan.variables}
    assert by_name["MY_VAR"].value == "x" and not by_name["MY_VAR"].inline
    assert by_name["NEW"].value == "a=b c" and by_name["NEW"].inline
    assert by_name["NCCL_SOCKET_IFNAME"].inline


def test_named_secret_warns_and_is_never_inline() -> None:
    plan = plan_environment(ENV, ["AWS_SECRET_ACCESS_KEY", "DB_PASSWORD=pw"])
    by_name = {v.name: v for v in plan.variables}
    assert by_name["AWS_SECRET_ACCESS_KEY"].secret and not by_name["AWS_SECRET_ACCESS_KEY"].inline
    assert by_name["DB_PASSWORD"].secret and not by_name["DB_PASSWORD"].inline
    assert len(plan.warnings) == 2


def test_a_secret_typed_on_the_command_line_gets_one_line_naming_the_safe_ways() -> None:
    plan = plan_environment(ENV, ["AWS_SECRET_ACCESS_KEY=v1", "DB_PASSWORD=pw", "HOROVOD_API_TOKEN"],
                            typed=("AWS_SECRET_ACCESS_KEY",))
    assert plan.warnings[0] == (
        "exporting AWS_SECRET_ACCESS_KEY, which looks like a secret, to every rank because you "
        "named it; its value, typed on the command line, shows in dtlaunch's process entry (ps) "
        "for the whole job: export AWS_SECRET_ACCESS_KEY and pass -x AWS_SECRET_ACCESS_KEY, or "
        "put it in an --env-file")
    # From an env file (not typed) or by name: the value is nowhere on a command line.
    assert [("command line" in w) for w in plan.warnings] == [True, False, False]
    assert not any(v.inline for v in plan.variables if v.secret)


@pytest.mark.parametrize(
    ("item", "message"),
    [("A-B", "invalid variable name"), ("BASH_FUNC_x%%", "invalid"), ("1X=2", "invalid"),
     ("=v", "invalid"), ("UNSET_HERE", "not set here")],
)
def test_bad_env_items(item: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan_environment(ENV, [item])


def test_env_given_twice() -> None:
    with pytest.raises(UsageError, match="more than once"):
        plan_environment(ENV, ["A=1", "A=2"])


def test_launcher_env_keeps_mpi_settings_drops_the_rest() -> None:
    plan = plan_environment(ENV, ["DB_PASSWORD=pw"])
    env = build_launcher_env(ENV, plan)
    assert env["OMPI_MCA_btl_base_verbose"] == "0"
    assert env["HOME"] == "/root"
    assert env["DB_PASSWORD"] == "pw"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "MY_VAR" not in env


@pytest.mark.parametrize(
    "name", ["GITHUB_TOKEN", "DB_PASSWORD", "AWS_ACCESS_KEY_ID", "MY_API_KEY", "SSH_PRIVATE",
             "GCP_SA", "AZURE_CLIENT_SECRET", "HF_TOKEN", "PASSWD"],
)
def test_secret_names(name: str) -> None:
    assert looks_secret(name)


@given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True), st.text(max_size=5)))
def test_no_secret_ever_exported_by_default(environ: dict[str, str]) -> None:
    plan = plan_environment(environ)
    assert not any(looks_secret(v.name) for v in plan.variables)
