"""The Gloo kind's part of the command line: its `dtlaunch doctor` flag. `dtlaunch run --gloo`
is horovodrun's own option (dtlaunch.horovod.options' table), which sets the request's
controller. Light: the CLI imports this module."""

from __future__ import annotations

from dtlaunch.jobkind import KindOption, KindOptions

OPTIONS = KindOptions(
    doctor=KindOption(("--gloo",), "gloo", type=None,
                      help="Check for a --gloo job: no MPI checks; Horovod must have Gloo."),
)
