"""Which environment variables reach the ranks, and how. Pure code.

Nothing is exported by default except an allow-list of what training needs; variables that look
like credentials are never exported unless the user names them, and then their values travel
only through mpirun's environment, never on a command line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dtlaunch.errors import UsageError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Exported to every rank when set locally.
ALLOW_NAMES = frozenset(
    {
        "PATH",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_HOME",
        "PYTHONHASHSEED",
        "LANG",
        "LC_ALL",
    }
)
ALLOW_PREFIXES = ("HOROVOD_", "NCCL_", "TORCH_", "GLOO_")

SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE")
SECRET_PREFIXES = ("AWS_", "GCP_", "AZURE_", "GOOGLE_APPLICATION_CREDENTIALS")

# What mpirun itself needs in its own environment (not forwarded to remote ranks, but local
# ranks inherit mpirun's environment, so this set is kept small and secret-free).
LAUNCHER_NAMES = frozenset(
    {"HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM", "SSH_AUTH_SOCK", "HOSTNAME", "TZ"}
)
LAUNCHER_PREFIXES = ("OMPI_", "OPAL_", "PMIX_", "PRTE_", "ORTE_")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS) or upper.startswith(SECRET_PREFIXES)


def is_allowed(name: str) -> bool:
    return name in ALLOW_NAMES or name.startswith(ALLOW_PREFIXES)


@dataclass(frozen=True)
class EnvVar:
    """One variable for the ranks.

    inline: passed as `-x NAME=VALUE` (visible in ps and --dry-run); otherwise `-x NAME` and the
    value sits in mpirun's environment.
    """

    name: str
    value: str
    inline: bool = False
    secret: bool = False


@dataclass(frozen=True)
class EnvPlan:
    variables: tuple[EnvVar, ...]
    warnings: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables)


def check_name(name: str, where: str = "--env") -> str:
    if not NAME_RE.match(name):
        raise UsageError(
            f"{where}: invalid variable name {name!r}; names are letters, digits and '_', "
            "not starting with a digit"
        )
    return name


def parse_env_item(item: str) -> tuple[str, str | None]:
    """`NAME` or `NAME=VALUE` (the value may contain anything, '=' included)."""
    name, sep, value = item.partition("=")
    check_name(name)
    return name, (value if sep else None)


def plan_environment(
    environ: Mapping[str, str],
    requested: Iterable[str] = (),
    fixed: Mapping[str, str] | None = None,
) -> EnvPlan:
    """Decide the variables for the ranks.

    requested: the user's `-x` items; fixed: what dtlaunch sets itself (e.g. NCCL_SOCKET_IFNAME).
    Later sources win: allow-listed environment < fixed < requested.
    """
    chosen: dict[str, EnvVar] = {}
    for name in sorted(environ):
        if is_allowed(name) and not looks_secret(name) and NAME_RE.match(name):
            chosen[name] = EnvVar(name, environ[name])
    for name, value in (fixed or {}).items():
        chosen[name] = EnvVar(name, value, inline=True)
    warnings: list[str] = []
    seen: set[str] = set()
    for item in requested:
        name, given = parse_env_item(item)
        if name in seen:
            raise UsageError(f"--env: {name} is given more than once")
        seen.add(name)
        secret = looks_secret(name)
        if given is None:
            if name not in environ:
                raise UsageError(f"--env: {name} is not set here; give it as {name}=VALUE")
            value, inline = environ[name], False
        else:
            value, inline = given, not secret
        if secret:
            warnings.append(
                f"exporting {name}, which looks like a secret, to every rank because you named it"
            )
        chosen[name] = EnvVar(name, value, inline=inline, secret=secret)
    return EnvPlan(tuple(chosen.values()), tuple(warnings))


def build_launcher_env(environ: Mapping[str, str], plan: EnvPlan) -> dict[str, str]:
    """mpirun's own environment: what it needs plus the planned variables, nothing else."""
    env = {
        k: v
        for k, v in environ.items()
        if (k in LAUNCHER_NAMES or k.startswith(LAUNCHER_PREFIXES)) and not looks_secret(k)
    }
    for var in plan.variables:
        env[var.name] = var.value
    return env
