# Run "$@" (a ProxyCommand: its standard input and output are dtlaunch's socket) and end it,
# with everything it started, when the pipe on descriptor $1 reports end of file. Only dtlaunch
# holds that pipe's write end, so the kernel closes it when dtlaunch dies, even by SIGKILL.
# dtlaunch starts this in a session of its own, so `kill 0` reaches exactly the proxy's
# processes: SIGTERM first, SIGKILL 2 s later (the watcher ignores SIGTERM itself so that it
# lives to send the SIGKILL). Neither the watcher nor this shell keeps the socket open: the
# proxy's exit is dtlaunch's end of file.
lifeline=$1
shift
# An asynchronous command's input is /dev/null unless redirected, and dash applies that before
# a `<&0`: hand the socket over through descriptor 4.
exec 4<&0
"$@" <&4 4<&- &
child=$!
{ while read -r _; do :; done <"/dev/fd/$lifeline"; trap '' TERM; kill -TERM 0; sleep 2; kill -KILL 0; } </dev/null >/dev/null 2>&1 4<&- &
exec <&- >&- 4<&-
wait "$child"
