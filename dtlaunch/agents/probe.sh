# dtlaunch's probe: one POSIX sh run per host, through the login shell's environment.
# $1 python  $2 script  $3 module  $4 working directory  $5 remote_probe.py's text
# $6 peers (space separated, names already validated)  $7 ssh options for peers
# $8 imports 0/1  $9 import_probe.py's text  $10 milliseconds nvidia-smi may take
# $11 the launcher's mpirun (absolute) or empty
# $12 the PATH the job exports to its ranks, where a bare $1 is looked up, or empty (this PATH)
# $13 the command's executable (bash, numactl, ./train), looked up as $1, or empty
bounded() {  # a command that may hang (a broken mpirun, a stuck ip) gets 10 s
  if command -v timeout >/dev/null 2>&1; then timeout 10 "$@"; else "$@"; fi
}
cd "$4" 2>/dev/null || true
# NVIDIA GPUs: nvidia-smi starts now, beside the rest of the probe. It can hang inside the
# driver, past any signal, so it writes to files (never to this probe's output, which must
# close) and is given up on, not waited for, after $10 ms. No nvidia-smi: nothing runs.
gpu_dir=
if command -v nvidia-smi >/dev/null 2>&1 && gpu_dir=$(mktemp -d 2>/dev/null); then
  ( nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
      >"$gpu_dir/query" 2>&1; : >"$gpu_dir/query.done" ) </dev/null >/dev/null 2>&1 &
  ( nvidia-smi >"$gpu_dir/header" 2>&1; : >"$gpu_dir/header.done" ) </dev/null >/dev/null 2>&1 &
fi
echo @@hostname; uname -n
echo @@path; printf '%s\n' "$PATH"
# With ${11} (the launcher's MPI, an absolute path) the job starts that same file and its
# daemon (orted; prted in Open MPI 5; Hydra's hydra_pmi_proxy) beside it on every host,
# whatever the login PATH says.
if [ -n "${11}" ]; then
  launcher="" daemon=""
  [ -f "${11}" ] && [ -x "${11}" ] && launcher=${11}
  for name in orted prted hydra_pmi_proxy; do
    if [ -z "$daemon" ] && [ -x "${11%/*}/$name" ]; then daemon=${11%/*}/$name; fi
  done
else
  launcher=$(command -v mpirun 2>/dev/null) || launcher=""
  daemon=$(command -v orted 2>/dev/null) || daemon=""
fi
echo @@launcher; printf '%s\n' "${11}"
echo @@mpirun; [ -n "$launcher" ] && printf '%s\n' "$launcher"
echo @@orted; [ -n "$daemon" ] && printf '%s\n' "$daemon"
echo @@mpirun_version
if [ -n "$launcher" ]; then bounded "$launcher" --version 2>&1 | head -n 5; fi
echo @@ip_link; bounded ip -o link show 2>/dev/null
echo @@ip_addr; bounded ip -o addr show 2>/dev/null
echo @@script
if [ -n "$2" ]; then if [ -f "$2" ]; then echo yes; else echo no; fi; fi
echo @@python
# A bare name is found as the ranks will find it: on the PATH the job exports, not this one.
found=no python=$1
case "$1" in
  */*) [ -f "$1" ] && [ -x "$1" ] && found=yes ;;
  *) python=$(if [ -n "${12}" ]; then PATH=${12}; fi; command -v "$1" 2>/dev/null) || python=
     case "$python" in /*) found=yes ;; esac ;;
esac
if [ "$found" = yes ]; then "$python" -c "$5" "$2" "$3" "$8" "$9" 2>&1 </dev/null
else
  case "$1" in
    */*) why="no such file or not executable" ;;
    *) why="not found on the PATH"; [ -n "${12}" ] && why="not found on the PATH the job exports" ;;
  esac
  printf '{"missing": true, "error": "%s"}\n' "$why"
fi
echo @@program
if [ -n "${13}" ]; then
  case "${13}" in
    */*) [ -f "${13}" ] && [ -x "${13}" ] && printf '%s\n' "${13}" ;;
    *) program=$(if [ -n "${12}" ]; then PATH=${12}; fi; command -v "${13}" 2>/dev/null)
       case "$program" in /*) printf '%s\n' "$program" ;; esac ;;
  esac
fi
echo @@peers
if [ -n "$6" ]; then
  set -f
  # A few logins at a time (each host's list starts after itself): all at once, 64 hosts
  # would each see 63 logins in progress, past sshd's MaxStartups (default 10), which drops them.
  pids=; running=0
  for peer in $6; do
    ( msg=$(ssh $7 "$peer" true 2>&1 </dev/null); rc=$?
      echo "$peer $rc $(printf '%s' "$msg" | tail -n 1)" ) &
    pids="$pids $!"; running=$((running + 1))
    if [ "$running" -ge 8 ]; then wait $pids; pids=; running=0; fi
  done
  wait $pids  # not nvidia-smi, which may never end
fi
echo @@gpu_status
if [ -z "$gpu_dir" ]; then echo absent
else
  ticks=0; limit=$(( ${10:-10000} / 20 ))
  while [ ! -f "$gpu_dir/query.done" ] || [ ! -f "$gpu_dir/header.done" ]; do
    [ "$ticks" -ge "$limit" ] && break
    if sleep 0.02 2>/dev/null; then ticks=$((ticks + 1)); else sleep 1; ticks=$((ticks + 50)); fi
  done
  for part in query header; do
    if [ -f "$gpu_dir/$part.done" ]; then echo "$part done"; else echo "$part timeout ${10:-10000}"; fi
  done
  echo @@gpu_query; [ -f "$gpu_dir/query.done" ] && head -n 128 "$gpu_dir/query"
  echo @@gpu_header; [ -f "$gpu_dir/header.done" ] && head -n 8 "$gpu_dir/header"
  rm -rf "$gpu_dir"
fi
echo @@end
