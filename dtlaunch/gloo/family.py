"""Gloo as a way of starting a job (the MpiFamily seam), with no MPI at all: dtlaunch's own
fan-out (dtlaunch.agents.gloo_start) starts one agent per host over ssh, which starts the
host's ranks. Pure; the job itself is prepared in dtlaunch.gloo.kind.

The shown command (`dtlaunch-gloo -np N -H HOSTS PROGRAM...`) names what runs; nothing of it
is a real command line: the job reaches the fan-out on its standard input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dtlaunch.agents import PIPE_BUF, SSH_ARGS_ENV
from dtlaunch.core.errors import UsageError
from dtlaunch.job.hosts import format_hosts
from dtlaunch.mpi import HostNeeds, JobSpec, MpiFamily

if TYPE_CHECKING:
    from dtlaunch.core.failure import Failure
    from dtlaunch.core.records import RecordParser

LAUNCHER = "dtlaunch-gloo"


class Gloo(MpiFamily):
    """No launcher of anyone else's: no MPI to refuse, no launcher defaults, no support files,
    no ssh setting files; the chosen network as is."""

    name = "Gloo"
    launcher = LAUNCHER
    prefix = "dtlaunch-gloo: "  # what the fan-out and its agents start their own lines with
    needs = HostNeeds(mpi=False, horovod="Gloo", option="--gloo")  # no MPI launcher runs
    install_hint = "the Gloo controller needs Horovod built with Gloo on every host"
    # The host agents' output joins whole lines only, and each record is one atomic write.
    record_limit = PIPE_BUF
    # dtlaunch ends the job on a failed rank's exit record (Gloo's survivors would wait for
    # it until their own timeout: horovodrun #3060).
    ends_job_on_rank_failure = False

    def build_argv(self, spec: JobSpec, launcher: str) -> tuple[str, ...]:
        for given, option in ((spec.mpi_args, "--mpi-args"), (spec.binding, "--binding-args"),
                              (spec.tree_spawn, "--tree-spawn")):
            if given:
                raise UsageError(f"{option}: no MPI launcher runs under {self.needs.option}; drop it")
        # The variables by name only: their values go to the hosts on ssh's standard input.
        names = [w for var in spec.env.variables for w in ("-x", var.name)]
        return (self.launcher, "-np", str(spec.num_proc), "-H", format_hosts(spec.hosts), *names,
                *spec.program)

    def new_demux(self, stream: str, release: tuple[int, ...] = ()) -> RecordParser:
        from dtlaunch.core.records import RecordParser

        return RecordParser(None, stream, PIPE_BUF)

    def parse_failure(self, lines: Sequence[str], rank_hosts: Sequence[str]) -> Failure | None:
        # The ranks' exit records and rsh's lost-link lines say what failed; an agent that
        # could not run says so in its own line, which the caller shows.
        import re

        from dtlaunch.core.failure import Failure

        prefix = self.prefix
        for line in lines:  # the agent's own reason first: it names what to fix
            if line.startswith(prefix + "host "):
                return Failure(host=line.split()[2].rstrip(":"),
                               reason=line[len(prefix):].strip())
        for line in lines:
            found = re.match(re.escape(prefix) + r"the agent on host (\S+) ended with status "
                             r"(\d+)", line)
            if found:
                return Failure(host=found.group(1), reason=(
                    f"dtlaunch's {self.name} agent on host {found.group(1)} ended with status "
                    f"{found.group(2)} (see its lines above)"))
            if line.startswith(prefix):
                return Failure(reason=line[len(prefix):].strip())
        return None

    def launcher_env(self, spec: JobSpec) -> dict[str, str]:
        """rsh.py's ssh options (dtlaunch's own: checked host keys, never a prompt)."""
        return {SSH_ARGS_ENV: json.dumps(spec.ssh.launcher_ssh_args())}

    # refuse_insecure is the protocol's (nothing): dtlaunch runs every ssh itself, and extra
    # launcher arguments are refused.
    def ssh_left_to_dtlaunch(self, extra_args: Sequence[str], environ: Mapping[str, str]) -> bool:
        return True  # no launcher of someone else's runs ssh


GLOO = Gloo()


class ElasticGloo(Gloo):
    """An elastic job: a failed rank is its driver's to handle (a reset on the survivors), not
    a reason for the launcher to end the job."""

    ends_job_on_rank_failure = True


ELASTIC_GLOO = ElasticGloo()
