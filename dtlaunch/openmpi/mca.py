"""Open MPI / PRRTE parameters that change how mpirun runs ssh. Pure.

dtlaunch lets a cached pre-flight leave host keys to mpirun's ssh (checking them only when the
job fails) only because that ssh refuses a changed or unknown key itself. A launch agent or
ssh arguments set by the user (`--mca plm_rsh_agent ...`, `-mca orte_rsh_agent ...`,
`--prtemca plm_ssh_args ...`, `OMPI_MCA_plm_rsh_args=...`, a parameter file named on the
command line or read by default, such as `~/.openmpi/mca-params.conf`) may not, so such a run
is checked first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence

from dtlaunch.core.errors import UsageError
from dtlaunch.core.textfile import read_launcher_file, read_small_text
from dtlaunch.reach.ssh_options import refuse_any_host_key

# The launch agent and its arguments under every name Open MPI 1.x-5.x and PRRTE have used:
# plm_rsh_*, plm_ssh_* (PRRTE), pls_rsh_* (1.x), orte_rsh_agent / orte_ssh_agent, prte_*.
# Compiled by the first MCA variable in the environment (re's cache).
_AGENT_NAME = r"(?i)(?:(?:plm|pls)_(?:rsh|ssh)_\w+|(?:orte|prte|opal)_(?:rsh|ssh)_\w+)"
# Parameter files whose contents could set any of them.
_PARAM_FILE_NAMES = ("mca_base_param_files", "mca_base_envar_file_prefix")
_PARAM_FILE_FLAGS = ("-am", "--am", "-tune", "--tune")
_ENV_PREFIXES = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_")

# The variables that choose how mpirun starts its daemons (ORTE's plm, PRRTE's, 1.x's pls), and
# the components that start daemons over ssh. Images built for one machine set
# OMPI_MCA_plm=isolated; across hosts mpirun then maps every rank here and stops with "All
# nodes which are allocated for this job are already filled".
_PLM_CHOICE = ("OMPI_MCA_plm", "PRTE_MCA_plm", "OMPI_MCA_pls")
_SSH_COMPONENTS = frozenset({"rsh", "ssh"})


def foreign_plm_choice(env: Mapping[str, str]) -> tuple[str, ...]:
    """The variables in `env` that choose a plm other than ssh's."""
    return tuple(name for name in _PLM_CHOICE
                 if name in env and env[name].strip() not in _SSH_COMPONENTS)


def _is_override(name: str) -> bool:
    return bool(re.fullmatch(_AGENT_NAME, name)) or name in _PARAM_FILE_NAMES


def _env_overrides(environ: Mapping[str, str]) -> list[str]:
    return [key for key in environ for prefix in _ENV_PREFIXES
            if key.startswith(prefix) and _is_override(key[len(prefix):])]


def ssh_overrides(args: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """What in the launcher's extra arguments or environment may change how ssh is run."""
    found = [arg for arg in args
             if arg in _PARAM_FILE_FLAGS
             or any(_is_override(part.lstrip("-")) for part in arg.split("="))]
    return found + _env_overrides(environ)


def refuse_insecure(extra_args: Sequence[str], environ: Mapping[str, str]) -> None:
    """A launch agent or ssh arguments that accept any host key are refused, with or without
    --no-check: dtlaunch never logs in to a host whose key it cannot verify."""
    text = " ".join(extra_args)
    places = [(f"--mpi-args {text!r}", text)] if ssh_overrides(extra_args, {}) else []
    places += [(f"the environment's {key}", environ[key]) for key in _env_overrides(environ)]
    for where, text in places:
        refuse_any_host_key(where, text)


def default_param_files(launcher: str, home: str) -> tuple[str, ...]:
    """The parameter files Open MPI, PRRTE and PMIx read without being told: the user's, and
    the installation's (beside `launcher`'s prefix, and Debian's /etc/openmpi)."""
    prefix = os.path.dirname(os.path.dirname(launcher)) if launcher else ""
    user = tuple(os.path.join(home, folder, "mca-params.conf")
                 for folder in (".openmpi", ".prte", ".pmix"))
    system = tuple(os.path.join(folder, f"{name}-mca-params.conf")
                   for folder in ((os.path.join(prefix, "etc"),) if prefix else ()) + ("/etc/openmpi",)
                   for name in ("openmpi", "prte", "pmix"))
    return user + system


def _settings(text: str) -> Iterator[tuple[str, str]]:
    """(name, value) for each `name = value` line of a parameter file's text (`#` comments)."""
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        if "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            yield name, value


def param_file_overrides(text: str) -> list[str]:
    """The names that may change how ssh is run, set in one parameter file's text."""
    return [name for name, _ in _settings(text) if _is_override(name)]


def plm_choice_in(text: str) -> list[str]:
    """`NAME = VALUE` for each line of a parameter file's text that chooses a plm other than
    ssh's (plm, or 1.x's pls)."""
    return [f"{name} = {value}" for name, value in _settings(text)
            if name in ("plm", "pls") and value not in _SSH_COMPONENTS]


def _default_param_texts(launcher: str) -> Iterator[tuple[str, str | None]]:
    """(path, text) of each parameter file Open MPI reads by default that exists; text None:
    it could not be read."""
    for path in default_param_files(launcher, os.path.expanduser("~")):
        if not os.path.lexists(path):
            continue
        try:
            yield path, read_small_text(path, "mca", 1 << 20, "an MCA parameter file")
        except UsageError:
            yield path, None


def param_files_choose_plm(launcher: str) -> tuple[str, ...]:
    """"FILE: plm = VALUE" for each plm choice other than ssh's in a parameter file that
    Open MPI (or PRRTE) reads by default. An unreadable file is left to mpirun."""
    return tuple(f"{path}: {choice}" for path, text in _default_param_texts(launcher)
                 if text is not None for choice in plm_choice_in(text))


def names_plm(args: Sequence[str]) -> bool:
    """The user's --mpi-args choose the plm themselves."""
    return any(arg.lstrip("-") in ("plm", "pls") or arg.lstrip("-").startswith(("plm=", "pls="))
               for arg in args)


def param_files_set_ssh(launcher: str) -> list[str]:
    """`file: name` for each launch-agent parameter set in a parameter file Open MPI reads by
    default. An unreadable file counts as setting one: nothing is assumed about it."""
    return [f"{path}: {name}" for path, text in _default_param_texts(launcher)
            for name in (["unreadable"] if text is None else param_file_overrides(text))]


# --- every parameter file mpirun will read, checked for an insecure agent ---------------------

_MAX_CHAIN = 8  # parameter files naming more parameter files (mca_base_param_files), deep


def _split_files(value: str) -> list[str]:
    return [part.strip() for part in re.split(r"[:,]", value) if part.strip()]


def _arg_values(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The value after each of `flags` in `args` (`-am FILE` or `-am=FILE`)."""
    found = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                found.append(value)
            elif i + 1 < len(args):
                found.append(args[i + 1])
    return found


def _mca_values(args: Sequence[str], environ: Mapping[str, str], wanted: str) -> list[str]:
    """Every value given to the MCA parameter `wanted` on the command line (`--mca NAME
    VALUE`, `--mca=NAME=VALUE`, any of mpirun's MCA flags) or in the environment."""
    found = [environ[prefix + wanted] for prefix in _ENV_PREFIXES if prefix + wanted in environ]
    for i, arg in enumerate(args):
        parts = arg.lstrip("-").split("=", 2)
        if len(parts) == 3 and parts[1] == wanted:
            found.append(parts[2])
        elif len(parts) == 2 and parts[0] == wanted:
            found.append(parts[1])
        elif arg.lstrip("-") == wanted and i + 1 < len(args):
            found.append(args[i + 1])
    return found


def _check_param_file(path: str, seen: set[str], depth: int = 0) -> None:
    """Refuse an insecure agent set in the parameter file at `path`, or in a parameter file it
    names in turn."""
    real = os.path.realpath(path)
    if real in seen or depth > _MAX_CHAIN:
        return
    seen.add(real)
    text = read_launcher_file(path, "an MCA parameter file")
    if text is None:
        return
    for name, value in _settings(text):
        if _is_override(name):
            refuse_any_host_key(f"the MCA parameter file {path} ({name})", value)
        if name == "mca_base_param_files":
            for more in _split_files(value):
                _check_param_file(os.path.expanduser(more), seen, depth + 1)


def refuse_insecure_files(launcher: str, args: Sequence[str], environ: Mapping[str, str],
                          home: str) -> None:
    """Refuse a launch agent or ssh arguments that accept any host key, set in any parameter
    file mpirun (Open MPI 1.x-5.x, PRRTE, PMIx) will read: the user's and the installation's,
    those named by mca_base_param_files (command line, environment, or another file), by -am
    (aggregate parameter sets) and by --tune (files of command-line options). Reads files:
    called at the edge. A file that is not a small regular one is named (UsageError)."""
    seen: set[str] = set()
    for path in default_param_files(launcher, home):
        _check_param_file(path, seen)
    for value in _mca_values(args, environ, "mca_base_param_files"):
        for path in _split_files(value):
            _check_param_file(os.path.expanduser(path), seen)
    prefix = os.path.dirname(os.path.dirname(launcher)) if launcher else ""
    sets = os.path.join(prefix, "share", "openmpi", "amca-param-sets") if prefix else ""
    for value in _arg_values(args, ("-am", "--am")):
        for name in value.split(","):
            name = name.strip()
            beside = os.path.join(sets, name) if sets else ""
            where = name if os.path.exists(name) or not beside else beside
            _check_param_file(os.path.expanduser(where), seen)
    for value in _arg_values(args, ("-tune", "--tune")):
        for path in value.split(","):
            text = read_launcher_file(path.strip(), "a --tune file")
            if text is not None:
                refuse_any_host_key(f"the --tune file {path.strip()}", text)


def unusable_param_files(launcher: str) -> list[str]:
    """One line for each parameter file Open MPI reads by default that it cannot use (a FIFO
    it would wait on for ever, a directory, a file over 1 MiB): what `run` refuses, for
    env-check to name."""
    found = []
    for path in default_param_files(launcher, os.path.expanduser("~")):
        try:
            read_launcher_file(path, "an MCA parameter file")
        except UsageError as exc:
            found.append(str(exc))
    return found
