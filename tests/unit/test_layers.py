"""The package's shape, held by its imports: the layers, the agents' rules, the map in the docs.

Floors, highest first (docs/architecture.md): a module imports its own room or rooms on lower
floors; nothing imports upward or sideways, so the rooms form no cycle.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.module_graph import module_graph

from dtlaunch.agents import JOINED

PACKAGE = Path(__file__).resolve().parents[2] / "dtlaunch"
DOCS = PACKAGE.parent / "docs"

# Each room of the package (a subpackage, or one of the three files that face their layer) and
# its floor. examples/ is the bundled training script: it imports nothing from dtlaunch.
LAYERS: dict[str, int] = {
    "__main__": 12, "cli": 11,
    "console": 10,
    "run": 9,
    "elastic": 8, "torchrun": 8,
    "doctor": 7, "gloo": 7, "mpijob": 7,
    "probe": 6, "jobkind": 6,
    "check": 5, "cluster": 5,
    "plan": 4, "openmpi": 4, "hydra": 4, "horovod": 4,
    "mpi": 3, "ssh": 3,
    "job": 2, "reach": 2,
    "core": 1,
    "agents": 0,
}
UI_ROOMS = {"cli", "__main__", "console"}  # the only users of click and rich
# The oldest Python each agent runs under: the probe's halves under the hosts' own (3.6 and
# later), the rank shim under the ranks' (3.7, see its docstring), rsh and lifeline under
# dtlaunch's own interpreter beside mpirun (requires-python).
OLDEST_PYTHON = {"remote_probe.py": (3, 6), "import_probe.py": (3, 6), "rank_shim.py": (3, 7),
                 "rsh.py": (3, 9), "lifeline.py": (3, 9), "gloo_host.py": (3, 7),
                 "c10d_store.py": (3, 7), "gloo_start.py": (3, 9), "torch_host.py": (3, 7)}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts)] = path
    return found


def room(module: str) -> str:
    return module.split(".")[0]


def imports(path: Path) -> list[tuple[str, int]]:
    """Every module an import statement names (absolute, below dtlaunch or not), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
            if node.module == "dtlaunch":
                found += [(f"dtlaunch.{alias.name}", node.lineno) for alias in node.names]
    return found


def test_every_room_has_a_floor() -> None:
    rooms = {room(m) for m in modules() if not m.startswith(("examples", "__init__"))}
    assert rooms == set(LAYERS)


def test_nothing_imports_upward() -> None:
    wrong = []
    for module, path in modules().items():
        here = room(module)
        if here in {"examples", "__init__"}:
            continue
        for name, line in imports(path):
            if not name.startswith("dtlaunch.") or name == "dtlaunch.__version__":
                continue
            there = name.split(".")[1]
            # Another room is always strictly lower: rooms form no cycle.
            if there in LAYERS and there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {name}")
    assert not wrong


# The longest import chain, in modules, lazy imports included (tests/helpers/module_graph.py):
# 13 before the rooms were flattened, 10 while the restart loop imported the single run
# (run.restart_session -> run.session); the loop now gets `launch` from session.start.
MODULE_FLOORS = 9


def test_modules_form_no_cycle_and_few_floors() -> None:
    graph = module_graph()
    assert graph.cycles() == []
    deepest = graph.deepest()
    assert len(deepest) <= MODULE_FLOORS, " -> ".join(deepest)


def test_modules_form_no_cycle_even_through_the_imports_for_types() -> None:
    """An import under `if TYPE_CHECKING:` never runs, but two modules that name each other's
    types still need each other to be read (run.session and run.restart_session did)."""
    assert module_graph(typed=True).cycles() == []


def test_agents_are_reached_through_their_package_only() -> None:
    """Outside agents/, `dtlaunch.agents` (path, text and the words the agents define) is the
    one way in: no module imports an agent's file as a module."""
    wrong = [f"{path.relative_to(PACKAGE)}:{line} imports {name}"
             for module, path in modules().items() if room(module) != "agents"
             for name, line in imports(path) if name.startswith("dtlaunch.agents.")]
    assert not wrong


def test_only_the_command_line_imports_click_and_rich() -> None:
    wrong = [f"{path.relative_to(PACKAGE)}:{line} imports {name}"
             for module, path in modules().items() if room(module) not in UI_ROOMS
             for name, line in imports(path) if name.split(".")[0] in {"click", "rich"}]
    assert not wrong


def test_only_the_command_line_prints() -> None:
    """The library tells its caller (events, callbacks, results); what runs on the hosts (agents)
    and the example are programs of their own and print what they like."""
    wrong = []
    for module, path in modules().items():
        if room(module) in UI_ROOMS | {"agents", "examples"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = node.func if isinstance(node, ast.Call) else None
            if (isinstance(called, ast.Name) and called.id == "print") or (
                    isinstance(called, ast.Attribute) and called.attr == "write"
                    and isinstance(called.value, ast.Attribute)
                    and called.value.attr in {"stdout", "stderr"}):
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not wrong


def test_the_example_imports_nothing_from_dtlaunch() -> None:
    wrong = [f"{path.relative_to(PACKAGE)}:{line} imports {name}"
             for module, path in modules().items() if room(module) == "examples"
             for name, line in imports(path) if name.split(".")[0] == "dtlaunch"]
    assert not wrong


AGENT_FILES = sorted(p for p in (PACKAGE / "agents").iterdir() if p.suffix in {".py", ".sh"}
                     and p.name != "__init__.py")


@pytest.mark.parametrize("path", [p for p in AGENT_FILES if p.suffix == ".py"], ids=lambda p: p.name)
def test_python_agent_keeps_to_the_oldest_python_and_the_standard_library(path: Path) -> None:
    oldest = OLDEST_PYTHON[path.name]  # a new agent says which Python it runs under
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, feature_version=oldest)  # raises on newer grammar
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            # An agent shipped as one text after others (agents.JOINED) names theirs as
            # siblings for the checkers and its own tests; shipped, they are in its text.
            joined = {f"{n[:-3]}" for n in JOINED.get(path.name, ())}
            if node.level == 1 and node.module in joined:
                continue
            assert node.level == 0, f"{path.name}:{node.lineno}: a relative import"
            assert oldest >= (3, 7) or node.module != "__future__" or all(
                a.name != "annotations" for a in node.names), \
                f"{path.name}:{node.lineno}: `from __future__ import annotations` is 3.7"
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top != "dtlaunch", f"{path.name}:{node.lineno} imports {name}"
            # torch and horovod are what the probe's import check is about, loaded on the host
            assert top in sys.stdlib_module_names or top in {"torch", "horovod"}, \
                f"{path.name}:{node.lineno} imports {name}, not in the standard library"


@pytest.mark.parametrize("path", [p for p in AGENT_FILES if p.suffix == ".sh"], ids=lambda p: p.name)
def test_shell_agent_parses_as_posix_sh(path: Path) -> None:
    shell = shutil.which("dash") or shutil.which("sh")
    assert shell
    result = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_the_agents_package_face_imports_only_its_agents() -> None:
    path = PACKAGE / "agents" / "__init__.py"
    for name, line in imports(path):
        assert name.split(".")[0] != "dtlaunch", f"agents/__init__.py:{line} imports {name}"


FAMILY_ROOMS = {"mpi", "openmpi", "hydra"}


def test_nothing_outside_the_families_asks_which_family_it_holds() -> None:
    """Everything a caller needs is on the MpiFamily Protocol: no isinstance on a family."""
    wrong = []
    for module, path in modules().items():
        if room(module) in FAMILY_ROOMS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "isinstance" and len(node.args) == 2
                    and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                    & {"OpenMpi", "Hydra"}):
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not wrong


# Where a family may be named: its own rooms, the table that classifies MPIs into families
# (with each family's host rule) and the one registry that maps a family to its object.
FAMILY_NAMERS = {"core.mpi_kinds", "mpijob.launcher_choice"}


def test_nothing_outside_the_families_names_one() -> None:
    """No family constant (OPEN_MPI_FAMILY, HYDRA_FAMILY) and no family object or class
    (OPEN_MPI, OpenMpi, Hydra) is used outside the families' rooms and their registries: a
    third family is its folder, its MPI_KINDS lines and its registry line."""
    names = {"OPEN_MPI_FAMILY", "HYDRA_FAMILY", "OPEN_MPI", "OpenMpi", "Hydra"}
    wrong = []
    for module, path in modules().items():
        if room(module) in FAMILY_ROOMS or module in FAMILY_NAMERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            used = (node.id if isinstance(node, ast.Name) else node.attr
                    if isinstance(node, ast.Attribute) else None)
            imported = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if used in names or names & set(imported):
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not wrong


def test_the_architecture_page_maps_every_room_and_module() -> None:
    """docs/architecture.md is the map: each subpackage, each top-level file and each module of
    a subpackage (but the example's) is named there, and each room has its floor above."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for entry in sorted(PACKAGE.iterdir()):
        if entry.is_dir() and (entry / "__init__.py").exists():
            if f"`{entry.name}/`" not in text:
                missing.append(f"{entry.name}/")
            if entry.name == "examples":
                continue
            missing += [f"{entry.name}/{p.name}" for p in sorted(entry.iterdir())
                        if p.suffix in {".py", ".sh"} and p.name != "__init__.py"
                        and f"`{p.name}`" not in text]
        elif (entry.suffix == ".py" and entry.name not in {"__init__.py", "__main__.py"}
              and f"`{entry.name}`" not in text):
            missing.append(entry.name)
    assert not missing


def test_no_test_file_imports_another() -> None:
    """What tests share lives in tests/helpers/ (the test beds among them); conftest.py holds
    fixtures and hooks, which pytest gives the tests, and is imported by none."""
    tests = Path(__file__).resolve().parents[1]
    wrong = [f"{path.name}:{line} imports {name}" for path in sorted(tests.rglob("*.py"))
             for name, line in imports(path)
             if name.split(".")[0].startswith("test_") or name.split(".")[0] == "conftest"]
    assert not wrong


def test_tests_live_by_what_they_need() -> None:
    """tests/unit/ needs no root, no network namespace, no sshd, no Slurm and no extra MPI venv;
    what needs the test bed lives in tests/testbed/ (the `testbed` marker, added from the
    fixtures a test uses, is held to the folder in conftest.py)."""
    tests = Path(__file__).resolve().parents[1]
    assert not list(tests.glob("test_*.py")), "a test file outside tests/unit and tests/testbed"
    assert sorted(p.name for p in (tests / "testbed").glob("test_*.py"))
    assert sorted(p.name for p in (tests / "unit").glob("test_*.py"))


def test_every_agent_travels_the_one_way_its_line_says() -> None:
    """agents.SHIPPING names each agent file once with how it travels; `ship(name)` is the only
    way to start or send one (the old `path`/`text` helpers are gone), and each Shipment gives
    only its own way."""
    from dtlaunch import agents

    assert set(agents.SHIPPING) == {p.name for p in AGENT_FILES}
    assert not hasattr(agents, "path") and not hasattr(agents, "text")
    forms = {
        agents.HERE: lambda s: s.here(),
        agents.TEXT: lambda s: s.text,
        agents.STDIN: lambda s: s.stdin(sys.executable),
        agents.INLINE: lambda s: s.inline(["true"], sys.executable, 4096),
    }
    for name, how in agents.SHIPPING.items():
        shipment = agents.ship(name)
        assert forms[how](shipment)  # its own way works
        for other, form in forms.items():
            if other != how:
                with pytest.raises(ValueError, match=f"{name} travels {how}"):
                    form(shipment)
