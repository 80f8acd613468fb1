# Run "$@" and end it, with everything it started, when this command's standard input closes:
# sshd does not signal a command whose client went away (Ctrl-C, a timeout), but it does
# close the command's input. sshd starts each command in a session of its own, so `kill 0`
# reaches exactly this command's processes.
exec 3<&0
"$@" </dev/null 3<&- &
child=$!
{ cat <&3 >/dev/null 2>&1; kill -TERM 0; } >/dev/null 2>&1 &
exec 3<&-
wait "$child"
