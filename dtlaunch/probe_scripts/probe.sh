# dtlaunch's probe: one POSIX sh run per host, through the login shell's environment.
# $1 python  $2 script  $3 module  $4 working directory  $5 remote_probe.py's text
# $6 peers (space separated, names already validated)  $7 ssh options for peers
# $8 imports 0/1  $9 import_probe.py's text  $10 the launcher's mpirun (absolute) or empty
bounded() {  # a command that may hang (a broken mpirun, a stuck ip) gets 10 s
  if command -v timeout >/dev/null 2>&1; then timeout 10 "$@"; else "$@"; fi
}
cd "$4" 2>/dev/null || true
echo @@hostname; uname -n
echo @@path; printf '%s\n' "$PATH"
# With ${10} (the launcher's MPI, an absolute path) the job starts that same file and its
# daemon (orted; prted in Open MPI 5; Hydra's hydra_pmi_proxy) beside it on every host,
# whatever the login PATH says.
if [ -n "${10}" ]; then
  launcher="" daemon=""
  [ -f "${10}" ] && [ -x "${10}" ] && launcher=${10}
  for name in orted prted hydra_pmi_proxy; do
    if [ -z "$daemon" ] && [ -x "${10%/*}/$name" ]; then daemon=${10%/*}/$name; fi
  done
else
  launcher=$(command -v mpirun 2>/dev/null) || launcher=""
  daemon=$(command -v orted 2>/dev/null) || daemon=""
fi
echo @@launcher; printf '%s\n' "${10}"
echo @@mpirun; [ -n "$launcher" ] && printf '%s\n' "$launcher"
echo @@orted; [ -n "$daemon" ] && printf '%s\n' "$daemon"
echo @@mpirun_version
if [ -n "$launcher" ]; then bounded "$launcher" --version 2>&1 | head -n 5; fi
echo @@ip_link; bounded ip -o link show 2>/dev/null
echo @@ip_addr; bounded ip -o addr show 2>/dev/null
echo @@script
if [ -n "$2" ]; then if [ -f "$2" ]; then echo yes; else echo no; fi; fi
echo @@python
found=no
case "$1" in
  */*) [ -f "$1" ] && [ -x "$1" ] && found=yes ;;
  *) command -v "$1" >/dev/null 2>&1 && found=yes ;;
esac
if [ "$found" = yes ]; then "$1" -c "$5" "$2" "$3" "$8" "$9" 2>&1 </dev/null
else echo '{"missing": true, "error": "no such file or not executable"}'; fi
echo @@peers
if [ -n "$6" ]; then
  set -f
  for peer in $6; do
    ( msg=$(ssh $7 "$peer" true 2>&1 </dev/null); rc=$?
      echo "$peer $rc $(printf '%s' "$msg" | tail -n 1)" ) &
  done
  wait
fi
echo @@end
