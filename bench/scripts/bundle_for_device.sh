#!/usr/bin/env bash
# Packs what `bench/scale_launch.py` needs onto a lent many-core machine that reaches no package
# registry (see bench/scripts/device_scale.sh): this machine's Open MPI 4 and OpenSSH run-time
# files as one tree (usr-merged, docs left out), the Python wheels dtlaunch imports, MPICH's
# wheel, and the tiny job built against each MPI. Run on Debian 12 with Open MPI 4 installed
# and the MPICH venv (scripts/setup_mpis.sh) present; writes FOLDER (default .devbench).
set -euo pipefail
out=${1:-.devbench}
mkdir -p "$out/whl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Open MPI 4, OpenSSH and iproute2 with the libraries they load, minus what every base image
# has (libc, libstdc++, util-linux).
packages=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1
  libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1 libmunge2 libpciaccess0
  libatomic1 openssh-server openssh-client openssh-sftp-server libwrap0 libfido2-1 libcbor0.8
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libedit2
  libbsd0 libmd0 libssl3 libsystemd0 libudev1 libuuid1 libzstd1 liblz4-1 libgcrypt20
  libgpg-error0 liblzma5 libnsl2 libtirpc3 libtirpc-common libpcre2-8-0 libselinux1 libaudit1
  libcap-ng0 libpam0g libcrypt1 zlib1g libtinfo6 libcap2 iproute2 libbpf1 libelf1 libmnl0
  libxtables12)
(cd "$work" && apt-get download "${packages[@]}" >/dev/null)
mkdir "$work/root"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
for top in lib lib64 bin sbin; do  # usr-merged, so it unpacks onto a merged / alike
  if [ -d "$work/root/$top" ] && [ ! -L "$work/root/$top" ]; then
    mkdir -p "$work/root/usr/$top" && cp -a "$work/root/$top/." "$work/root/usr/$top/"
    rm -rf "${work:?}/root/$top"
  fi
done
rm -rf "$work"/root/usr/share/{doc,man,locale,lintian}
tar -czf "$out/bedroot.tar.gz" -C "$work/root" .

# Wheels for the device's Python 3.12, at the versions this venv holds.
venvs=${DTLAUNCH_MPI_VENVS:-$HOME/.cache/dtlaunch/mpi-venvs}
version() { "${2:-python3}" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
wheels=()
for name in paramiko bcrypt cffi cryptography invoke pycparser pynacl; do
  wheels+=("$name==$(version "$name")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 -d "$out/whl" \
  "${wheels[@]}" "mpich==$(version mpich "$venvs/mpich/bin/python")"
# python-hostlist comes as source only: a wheel of it, built here (pure Python).
python3 -m pip wheel -q --no-deps -w "$out/whl" "python-hostlist==$(version python-hostlist)"

mpicc -O2 -o "$out/tiny_openmpi4" bench/scripts/tiny_mpi.c
"$venvs/mpich/bin/mpicc" -O2 -o "$out/tiny_mpich" bench/scripts/tiny_mpi.c
du -sh "$out"
