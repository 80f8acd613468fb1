#!/usr/bin/env bash
# `bench/scale_launch.py` on a lent many-core machine that reaches no package registry, from
# the bundle bench/scripts/bundle_for_device.sh wrote (FOLDER, default .devbench). Unpacks it
# without replacing any file the machine already has, installs the wheels into the running
# Python, lays MPICH out as the bench expects its venv, then runs the bench with the jobs built
# elsewhere. Results go to bench/results/ and, when $OUT is set, to $OUT too.
#
#   bash bench/scripts/device_scale.sh [FOLDER] -- [scale_launch.py arguments]
set -uo pipefail
bundle=${1:-.devbench}
shift || true
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-python3}
started=$(date +%s)
say() { echo "[device_scale +$(( $(date +%s) - started ))s] $*"; }

say "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r)," \
    "$(. /etc/os-release && echo "$PRETTY_NAME"), $($python -V 2>&1)"
say "before: sshd=$(command -v sshd || echo -) ssh=$(command -v ssh || echo -)" \
    "mpirun=$(command -v mpirun || echo -) ip=$(command -v ip || echo -)" \
    "cgroup=$(stat -fc %T /sys/fs/cgroup 2>/dev/null)"

# Open MPI 4, OpenSSH, iproute2: only files the machine lacks, its own directories untouched.
tar -xzf "$bundle/bedroot.tar.gz" -C / --skip-old-files --keep-directory-symlink \
    || { say "unpacking failed"; exit 1; }
for name in mpirun mpiexec; do
  [ -e /usr/bin/$name ] || ln -s mpirun.openmpi /usr/bin/$name  # Debian's alternatives
done
ldconfig
id sshd >/dev/null 2>&1 || useradd -r -d /run/sshd -s /usr/sbin/nologin sshd
mkdir -p /run/sshd && chmod 755 /run/sshd
# dtlaunch's own imports go into this Python; MPICH goes beside it (below), not onto its PATH,
# where its mpirun would shadow Open MPI's.
$python -m pip uninstall -y -q mpich >/dev/null 2>&1
say "after: sshd=$(command -v sshd) $(ssh -V 2>&1) mpirun: $(mpirun --version 2>&1 | head -1)"
$python -m pip install -q --no-index --no-deps --no-compile --ignore-installed \
  $(ls "$bundle"/whl/*.whl | grep -v /mpich-) 2>&1 | grep -v "^WARNING\|^\[notice\]" >&2
export DTLAUNCH_MPI_VENVS=${DEVICE_MPI_VENVS:-/root/.cache/dtlaunch/mpi-venvs}  # tiny_mpich's RUNPATH
venv=$DTLAUNCH_MPI_VENVS/mpich
mkdir -p "$venv/bin"
$python -m zipfile -e "$(echo "$bundle"/whl/mpich-*.whl)" "$venv/wheel"  # no unzip there
data=$(echo "$venv"/wheel/mpich-*.data/data)
cp -a "$data/." "$venv/"
chmod +x "$venv"/bin/*
printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$python")" > "$venv/bin/python"
chmod +x "$venv/bin/python"
say "mpich: $("$venv/bin/mpiexec" --version 2>&1 | grep -m1 Version)"
$python -c "import paramiko, click, rich, psutil, hostlist, yaml, packaging; print('imports ok, paramiko', paramiko.__version__)" \
  || exit 1
# The bed's ranks run as root through sshd: an empty login shell setup is fine, a missing
# known_hosts folder is not.
mkdir -p /root/.ssh && chmod 700 /root/.ssh

# The lent machines' image sets OMPI_MCA_plm=isolated (one machine only): the hand-written
# mpirun line would map every rank to h1 and stop. dtlaunch leaves it out by itself.
unset OMPI_MCA_plm PRTE_MCA_plm

say "bench: scale_launch.py $*"
PYTHONUNBUFFERED=1 $python bench/scale_launch.py --prebuilt "$bundle" "$@"
rc=$?
say "bench exit $rc"
if [ -n "${OUT:-}" ]; then
  for arg in "$@"; do
    case $arg in *.md|*.png) cp -f "bench/results/$arg" "$OUT/" 2>/dev/null ;; esac
  done
  cp -f bench/results/raw/*.json "$OUT/" 2>/dev/null
fi
exit $rc
