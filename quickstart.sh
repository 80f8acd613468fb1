#!/usr/bin/env bash
# dtlaunch quick start: all set-up on a fresh Debian/Ubuntu machine, then one action.
#   ./quickstart.sh demo   install what the demo uses (Open MPI, build tools, .venv with PyTorch,
#                          dtlaunch and one Horovod build), then train the bundled PTB model on
#                          2 local ranks (short run)
#   ./quickstart.sh test   the demo's set-up plus what the tests use (sshd, Slurm, the extra MPI
#                          venvs, dev tools), then run the whole suite (lint, types, unit, multi-host)
#   ./quickstart.sh setup  the test set-up only
# Idempotent: a second run checks what is there and takes seconds.
set -euo pipefail

cd "$(dirname "$0")"
ROOT=$(pwd)
VENV=${DTLAUNCH_VENV:-$ROOT/.venv}
TORCH_SPEC=${DTLAUNCH_TORCH:-torch==2.13.0}
# What the demo uses: Open MPI, the compilers Horovod's build needs, Python's venv and headers.
DEMO_APT=(openmpi-bin libopenmpi-dev cmake g++ make python3-venv python3-dev procps iproute2
          openssh-client ca-certificates)
# What the tests add: sshd for the multi-host test bed, a Slurm cluster, util-linux's unshare.
TEST_APT=(openssh-server util-linux slurmctld slurmd slurm-client munge)

log() { printf '\033[1mquickstart:\033[0m %s\n' "$*"; }

install_apt() {  # packages
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then return; fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "quickstart: missing packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_python() {  # pip extras for dtlaunch: train, or train,dev
  local extras=$1
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  local py="$VENV/bin/python" stamp="$VENV/.dtlaunch-installed"
  if ! "$py" -c "import torch" 2>/dev/null; then
    log "installing PyTorch ($TORCH_SPEC)"
    "$py" -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
  fi
  # The stamp lists the extras installed for this pyproject.toml; a test set-up serves the demo.
  local hash
  hash=$( (sha256sum pyproject.toml; echo editable_mode=compat) | sha256sum | cut -d' ' -f1)
  if ! grep -qxF "$extras $hash" "$stamp" 2>/dev/null \
     && ! grep -qxF "train,dev $hash" "$stamp" 2>/dev/null; then
    log "installing dtlaunch and its dependencies ([$extras])"
    # compat: a plain path in a .pth, not an import hook that every Python start in this
    # venv would load (~18 ms, dtlaunch's own start included).
    "$py" -m pip install -q --disable-pip-version-check -e ".[$extras]" \
      --config-settings editable_mode=compat
    echo "$extras $hash" >> "$stamp"
  fi
  "$VENV/bin/dtlaunch" install-horovod
}

ptb_data() {
  # The example downloads the data into data/ptb when it is missing; a sibling checkout of the
  # data (../shared/data/ptb, as in CI) is used when present so the demo also runs offline.
  if [ -n "${DTLAUNCH_PTB_DATA:-}" ]; then echo "$DTLAUNCH_PTB_DATA"
  elif [ -f "$ROOT/../shared/data/ptb/ptb.train.txt" ]; then echo "$ROOT/../shared/data/ptb"
  else echo "$ROOT/data/ptb"; fi
}

install_mpis() {
  # Open MPI 5, MPICH and Intel MPI (PyPI's wheels), each in its own venv with Horovod built for
  # it: the test bed runs the multi-host suite per MPI. DTLAUNCH_SKIP_MPIS=1 leaves them out.
  if [ "${DTLAUNCH_SKIP_MPIS:-0}" = 1 ]; then return; fi
  DTLAUNCH_TORCH="$TORCH_SPEC" bash "$ROOT/scripts/setup_mpis.sh"
}

demo_setup() { install_apt "${DEMO_APT[@]}"; install_python train; }
test_setup() { install_apt "${DEMO_APT[@]}" "${TEST_APT[@]}"; install_python train,dev; install_mpis; }

case "${1:-}" in
  setup) test_setup ;;
  demo)
    demo_setup
    log "training the PTB small model on 2 local ranks (short run)"
    exec "$VENV/bin/dtlaunch" run -np 2 -m dtlaunch.examples.ptb_lm --config small \
      --data-path "$(ptb_data)" --max-steps "${DTLAUNCH_DEMO_STEPS:-300}" --log-interval 50
    ;;
  test)
    test_setup
    log "ruff, mypy, pytest"
    export DTLAUNCH_PTB_DATA=${DTLAUNCH_PTB_DATA:-$(ptb_data)}
    "$VENV/bin/ruff" check dtlaunch tests bench
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest -q "${@:2}"
    ;;
  *) echo "usage: $0 demo|test|setup" >&2; exit 2 ;;
esac
