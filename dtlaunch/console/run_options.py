"""`dtlaunch run`'s own options, each declared in its `--help` section (console/options.py's
`option_group`), then each job kind's own (their sections before "Print and exit"), then
horovodrun's, generated from their table and placed by `horovod_section`. What they parse is
read by console/run_args.py (`RunOptions`)."""

from __future__ import annotations

import click

from dtlaunch.console.options import (
    CHECKS,
    EXIT,
    HOST_OPTIONS,
    HOSTS,
    MPI,
    NETWORK,
    OUTPUT,
    PROGRAM,
    RESTARTS,
    RUN_OWN_FLAGS,
    SECONDS,
    SSH,
    F,
    horovod_click_options,
    kind_option_groups,
    option_group,
    single_option,
)

_GROUPS = (
    option_group(
        HOSTS, HOST_OPTIONS["hosts"], HOST_OPTIONS["hostfile"],
        single_option("-np", "--num-proc", "num_proc", type=int, metavar="N",
                      help="Number of processes (default: all slots)."),
        click.option("--oversubscribe", is_flag=True, help="Allow more processes than slots."),
        HOST_OPTIONS["via"]),
    option_group(
        PROGRAM,
        single_option("-m", "module", metavar="MODULE", help="Run a module, like python -m."),
        HOST_OPTIONS["python"],
        click.option("-x", "--env", "env_items", multiple=True, metavar="NAME[=VALUE]",
                     help="Export a variable to every rank (repeatable)."),
        single_option("--env-file", metavar="FILE",
                      help="Export the NAME=VALUE lines of FILE to every rank (-x beats the file).")),
    option_group(
        SSH, HOST_OPTIONS["ssh_port"], HOST_OPTIONS["ssh_identity_file"], HOST_OPTIONS["ssh_config"],
        HOST_OPTIONS["connect_timeout"], HOST_OPTIONS["accept_new_host_keys"],
        click.option("--ssh-default-kex", is_flag=True,
                     help="Keep ssh's own key exchange order for the job's links (dtlaunch otherwise "
                          "offers a fast one first where OpenSSH 9.x's default is slow; "
                          "docs/security.md).")),
    option_group(NETWORK, HOST_OPTIONS["iface"]),
    option_group(
        MPI,
        single_option("--mpi-args", metavar="ARGS", help="Extra mpirun arguments, split like a shell."),
        click.option("--tree-spawn", is_flag=True,
                     help="Let Open MPI spawn daemons in a tree (needs SSH between every pair of "
                          "hosts).")),
    option_group(CHECKS, click.option("--no-check", is_flag=True, help="Skip the pre-flight checks.")),
    option_group(
        OUTPUT,
        single_option("--output-dir", metavar="DIR",
                      help="Also write each rank's output to DIR/rank.N.log."),
        single_option("--ranks", "ranks_spec", metavar="SPEC",
                      help="Show only these ranks' output on the console: 0, 0,3-5, last or all "
                           "(--output-dir still gets every rank's; failures always show)."),
        single_option("--local-ranks-filter", "--local_ranks_filter", "local_ranks_spec",
                      metavar="SPEC",
                      help="torchrun's spelling: show only these local ranks (index on each host)."),
        click.option("--json", "as_json", is_flag=True,
                     help="At the end, print how the job ended as one JSON document on stdout (the "
                          "ranks' output then goes to stderr)."),
        click.option("-v", "--verbose", is_flag=True, help="Print the command before running it.")),
    option_group(
        RESTARTS,
        single_option("--timeout", type=SECONDS, metavar="SECONDS",
                      help="Stop the whole job after this long."),
        single_option("--max-restarts", type=int, metavar="N",
                      help="Start a failed job again up to N times, without the hosts that failed."),
        single_option("--min-np", type=int, metavar="N",
                      help="With --max-restarts: fewest processes to go on with; otherwise elastic "
                           "mode's fewest (docs/elastic.md)."),
        single_option("--restart-delay", type=SECONDS, metavar="SECONDS",
                      help="With --max-restarts: wait this long before each restart.")),
    option_group(EXIT, click.option("--dry-run", is_flag=True,
                                     help="Print the mpirun command and exit.")),
)


def run_options(func: F) -> F:
    """Declare all of `dtlaunch run`'s options on `func`, section by section."""
    func = horovod_click_options(RUN_OWN_FLAGS)(func)  # each in its section (horovod_section)
    for group in reversed((*_GROUPS[:-1], *kind_option_groups(), _GROUPS[-1])):
        func = group(func)
    return func
