# Run "$@" and end it, with everything it started, when this command's standard input closes:
# sshd does not signal a command whose client went away (Ctrl-C, a timeout), but it does
# close the command's input. sshd starts each command in a session of its own, so `kill 0`
# reaches exactly this command's processes: SIGTERM first, SIGKILL 2 s later for whatever
# ignores it (the watcher ignores SIGTERM itself so that it lives to send the SIGKILL). The
# watcher reads with the shell's own `read`: a PATH without cat must not end the command early.
exec 3<&0
"$@" </dev/null 3<&- &
child=$!
{ while read -r _; do :; done <&3; trap '' TERM; kill -TERM 0; sleep 2; kill -KILL 0; } >/dev/null 2>&1 &
exec 3<&-
wait "$child"
