"""Which environment variables reach the ranks, and how. Pure code.

Nothing is exported by default except an allow-list of what training needs; variables that look
like credentials are never exported unless the user names them, and then their values travel
only through mpirun's environment, never on a command line.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_small_text

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Exported to every rank when set locally.
ALLOW_NAMES = frozenset({
    "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "CUDA_HOME",
    "PYTHONHASHSEED", "LANG", "LC_ALL"})
# MPIR_CVAR_ and I_MPI_: MPICH's and Intel MPI's settings, read by each rank (Hydra exports
# only the variables it is given; Open MPI's OMPI_MCA_ ones travel with mpirun itself).
ALLOW_PREFIXES = ("HOROVOD_", "NCCL_", "TORCH_", "GLOO_", "MPIR_CVAR_", "I_MPI_")

SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE")
SECRET_PREFIXES = ("AWS_", "GCP_", "AZURE_", "GOOGLE_APPLICATION_CREDENTIALS")

# What mpirun itself needs in its own environment (not forwarded to remote ranks, but local
# ranks inherit mpirun's environment, so this set is kept small and secret-free).
# CUDA_VISIBLE_DEVICES is here, not on the allow-list: GPU numbers and UUIDs are per machine, so
# mpirun's value reaches only the ranks on this machine (horovod PR #3865).
LAUNCHER_NAMES = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM", "SSH_AUTH_SOCK",
                            "HOSTNAME", "TZ", "CUDA_VISIBLE_DEVICES"})
LAUNCHER_PREFIXES = ("OMPI_", "OPAL_", "PMIX_", "PRTE_", "ORTE_")


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS) or upper.startswith(SECRET_PREFIXES)


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


def plan_environment(environ: Mapping[str, str], requested: Iterable[str] = (),
                     fixed: Mapping[str, str] | None = None, typed: Collection[str] = ()) -> EnvPlan:
    """Decide the variables for the ranks.

    requested: the user's `-x` items; fixed: what dtlaunch sets itself (e.g. NCCL_SOCKET_IFNAME);
    typed: names whose `NAME=VALUE` was written on dtlaunch's own command line (not read from
    a file). Later sources win: allow-listed environment < fixed < requested. A secret's
    value never goes on mpirun's command line: it travels in mpirun's environment.
    """
    chosen: dict[str, EnvVar] = {}
    for name in sorted(environ):
        allowed = name in ALLOW_NAMES or name.startswith(ALLOW_PREFIXES)
        if allowed and not looks_secret(name) and NAME_RE.match(name):
            chosen[name] = EnvVar(name, environ[name])
    for name, value in (fixed or {}).items():
        chosen[name] = EnvVar(name, value, inline=True)
    warnings: list[str] = []
    seen: set[str] = set()
    for item in requested:  # NAME or NAME=VALUE (the value may hold anything, '=' too)
        name, sep, value = item.partition("=")
        if not NAME_RE.match(name):
            raise UsageError(f"--env: invalid variable name {name!r}; names are letters, digits "
                             "and '_', not starting with a digit")
        if name in seen:
            raise UsageError(f"--env: {name} is given more than once")
        seen.add(name)
        secret = looks_secret(name)
        if not sep:
            if name not in environ:
                raise UsageError(f"--env: {name} is not set here; give it as {name}=VALUE")
            value = environ[name]
        if secret:
            line = f"exporting {name}, which looks like a secret, to every rank because you named it"
            if sep and name in typed:  # anyone here can read it (ps) for the whole job
                line += (f"; its value, typed on the command line, shows in dtlaunch's process "
                         f"entry (ps) for the whole job: export {name} and pass -x {name}, or put "
                         "it in an --env-file")
            warnings.append(line)
        chosen[name] = EnvVar(name, value, inline=bool(sep) and not secret, secret=secret)
    return EnvPlan(tuple(chosen.values()), tuple(warnings))


def build_launcher_env(environ: Mapping[str, str], plan: EnvPlan) -> dict[str, str]:
    """mpirun's own environment: what it needs plus the planned variables, nothing else."""
    env = {k: v for k, v in environ.items()
           if (k in LAUNCHER_NAMES or k.startswith(LAUNCHER_PREFIXES)) and not looks_secret(k)}
    return env | {var.name: var.value for var in plan.variables}


# Set here but not sent, and likely to matter to training: named in one line so nothing is
# dropped silently. (OMPI_MCA_* are not listed: mpirun forwards them itself.)
TRAINING_PREFIXES = (
    "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCHELASTIC_", "UCX_", "FI_", "PSM2_", "PSM3_",
    "HCOLL_", "SHARP_", "MLX5_", "IBV_", "TF_", "XLA_", "JAX_", "MKL_", "KMP_", "OMP_", "GOMP_",
    "OPENBLAS_", "BLIS_", "DNNL_", "ONEDNN_", "CUDA_", "CUDNN_", "CUBLAS_", "NVIDIA_", "NVTE_",
    "HIP_", "ROCR_", "HSA_", "MIOPEN_", "RCCL_", "I_MPI_", "MPICH_", "MV2_", "HF_", "TRANSFORMERS_",
    "TOKENIZERS_", "WANDB_", "MLFLOW_", "MALLOC_", "TCMALLOC_",
)
TRAINING_NAMES = frozenset({"LD_PRELOAD", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "PYTHONMALLOC",
                            "PYTHONNOUSERSITE", "PYTHONUSERBASE", "MASTER_ADDR", "MASTER_PORT"})
# Deliberately kept home (see LAUNCHER_NAMES), so not worth a note.
_NOT_NOTED = frozenset({"CUDA_VISIBLE_DEVICES"})


def kept_home(environ: Mapping[str, str], plan: EnvPlan) -> tuple[str, ...]:
    """Training-looking variables set here that the ranks will not get (secrets excluded)."""
    sent = set(plan.names())
    return tuple(sorted(
        n for n in environ
        if n not in sent and n not in _NOT_NOTED and not looks_secret(n)
        and (n.startswith(TRAINING_PREFIXES) or n in TRAINING_NAMES)
    ))


def kept_home_note(environ: Mapping[str, str], plan: EnvPlan, limit: int = 8) -> str | None:
    """One line for the CLI to print, or None."""
    names = kept_home(environ, plan)
    if not names:
        return None
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return (f"not sent to the ranks (not on the allow-list): {shown}; send them with -x NAME "
            "or --env-file FILE")


# --- --env-file ---------------------------------------------------------------------------------

MAX_ENV_FILE_BYTES = 1 << 20


def _unquote(value: str, where: str, name: str) -> str:
    """One pair of matching quotes around the value goes; a value that opens a quote and does
    not close it (`A="abc`) is an error rather than a value with a stray quote in it."""
    if value[:1] in ("'", '"'):
        quote = value[0]
        if len(value) < 2 or value[-1] != quote:
            raise UsageError(f"{where}: the value of {name} opens a {quote} quote that the line "
                             f"does not close; quote the whole value or none of it")
        return value[1:-1]
    return value


def parse_env_file_text(text: str, path: str = "env file",
                        environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """`--env-file`: `NAME=VALUE` lines into `-x` items, in order.

    Blank lines and lines starting with '#' are skipped; `export NAME=VALUE` is accepted; one
    pair of matching quotes around a value is removed, nothing else is interpreted (no
    escapes, no $VARIABLES). A bare `NAME` sends this machine's value, like `-x NAME`; with
    `environ`, a bare name that is not set is an error here, with its line. A UTF-8 byte order
    mark at the start (editors on Windows write one) is not part of the first name."""
    items: list[str] = []
    first: dict[str, int] = {}
    text = text.removeprefix("\ufeff")
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") and "=" in line:
            line = line[len("export "):].lstrip()
        name, sep, value = line.partition("=")
        if not NAME_RE.match(name):
            expected = "" if sep else f"expected NAME=VALUE, got {line!r}; "
            raise UsageError(f"{where}: {expected}invalid variable name {name!r}; names are "
                             "letters, digits and '_', not starting with a digit")
        if name in first:
            raise UsageError(f"{where}: {name} is already set on line {first[name]}")
        first[name] = lineno
        if not sep and environ is not None and name not in environ:
            raise UsageError(f"{where}: {name} is not set here; give it as {name}=VALUE")
        items.append(f"{name}={_unquote(value, where, name)}" if sep else name)
    return tuple(items)


def read_env_file(path: str, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Read and parse `--env-file PATH`; every failure is a one-line UsageError."""
    text = read_small_text(path, "--env-file", MAX_ENV_FILE_BYTES, "an env file")
    return parse_env_file_text(text, path, environ)


def merge_env_items(from_file: Iterable[str], from_flags: Iterable[str]) -> tuple[str, ...]:
    """The file's items, then `-x`'s; a name given with -x replaces the file's."""
    flags = tuple(from_flags)
    named = {item.partition("=")[0] for item in flags}
    return tuple(i for i in from_file if i.partition("=")[0] not in named) + flags


# What Open MPI's Slurm support reads from mpirun's environment (ras slurm: the allocation;
# plm slurm: whether to start its daemons with srun) plus what that srun needs to join this
# job's allocation instead of asking for a new one. Open MPI 4 reads the old names
# (SLURM_JOBID, SLURM_NODELIST); current Slurm sets both spellings, so both are kept.
SLURM_LAUNCH_NAMES = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                      "SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_CPUS_PER_TASK",
                      "SLURM_CONF")
_ALIASES = (("SLURM_JOB_ID", "SLURM_JOBID"), ("SLURM_JOB_NODELIST", "SLURM_NODELIST"))


def slurm_launch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Exactly the SLURM_* variables mpirun needs to launch through srun; {} outside Slurm."""
    env = {n: environ[n] for n in SLURM_LAUNCH_NAMES if n in environ}
    if not env.get("SLURM_JOB_ID") and not env.get("SLURM_JOBID"):
        return {}
    for new, old in _ALIASES:
        if new in env and old not in env:
            env[old] = env[new]
        elif old in env and new not in env:
            env[new] = env[old]
    return env
