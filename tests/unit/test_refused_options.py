"""An option the MPI's launcher refuses is named in dtlaunch's last line, with where it came from:
--mpi-args, or (when an option there lacked its value and took the next word) dtlaunch's own."""

from __future__ import annotations

import pytest

from dtlaunch.core.failure import Failure, blame_mpi_args
from dtlaunch.hydra.output import analyze_hydra
from dtlaunch.openmpi.failures import analyze

# Each launcher's own words, as they print them.
ORTE = ['/usr/bin/mpirun: Error: unknown option "-foo"', "Type '/usr/bin/mpirun --help' for usage."]
PRRTE = ["-" * 74, "An unrecognized option was included on the mpirun command line:", "",
         "  Option: --foo", "", 'Please use the "mpirun --help" command to obtain a list of all',
         "supported options.", "-" * 74]
HYDRA = ["[mpiexec@vm] match_arg (/mpich-5.0.2/src/pm/hydra/lib/utils/args.c:166): "
         "unrecognized argument foo",
         "[mpiexec@vm] HYDU_parse_array (/mpich-5.0.2/src/pm/hydra/lib/utils/args.c:181): "
         "argument matching returned error"]
INTEL = ["[mpiexec@vm] match_arg (../../../../../src/pm/i_hydra/libhydra/arg/hydra_arg.c:82): "
         "unrecognized argument foo", "[mpiexec@vm] Similar arguments:", "[mpiexec@vm] \t gtool"]


@pytest.mark.parametrize("lines, option", [(ORTE, "-foo"), (PRRTE, "--foo")], ids=["orte", "prrte"])
def test_open_mpi_names_the_option_it_refused(lines: list[str], option: str) -> None:
    failure = analyze(lines, ["h1"])
    assert failure is not None and failure.option == option
    assert failure.describe().startswith(f"mpirun does not take the option {option} ")


@pytest.mark.parametrize("lines", [HYDRA, INTEL], ids=["mpich", "intelmpi"])
def test_hydra_names_the_option_it_refused(lines: list[str]) -> None:
    failure = analyze_hydra(lines, ["h1"])
    assert failure is not None and failure.option == "-foo"
    assert failure.describe().startswith("mpiexec does not take the option -foo ")


def test_the_option_is_blamed_on_mpi_args_or_on_a_missing_value_there() -> None:
    refused = Failure(option="--foo", reason="mpirun does not take the option --foo")
    assert blame_mpi_args(refused, ("-foo", "bar")).describe().endswith("came from --mpi-args")
    own = Failure(option="-I", reason="mpirun does not take the option -I")
    said = blame_mpi_args(own, ("-x",)).describe()
    assert "not one of --mpi-args" in said and "lacks its value (-x)" in said
    assert blame_mpi_args(refused, ()) == refused  # no --mpi-args: nothing to add
    exited = Failure(rank=0, exit_code=3)
    assert blame_mpi_args(exited, ("-foo",)) == exited
