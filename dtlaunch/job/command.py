"""What the ranks run: the words after `dtlaunch run`'s options, read the way horovodrun reads them.

The rule, first match wins (pure: whether a path is a local file is asked of `is_file`):
1. `-m MODULE [ARGS]`            -> the interpreter (`--python`, default dtlaunch's) runs the module.
2. a first word starting with '-' -> an option dtlaunch does not know: refused, with a suggestion.
3. a first word ending in `.py`  -> the shorthand `dtlaunch run train.py`: the interpreter runs
   the script, which must exist here (the same path is checked on the hosts by the pre-flight).
4. a Python interpreter (`python`, `python3`, `python3.11`, a path ending in one of them)
   -> horovodrun's form `python train.py ...`: run exactly as given.
5. anything else (`bash run.sh`, `./train`, `numactl ... python ...`, `nsys profile ...`)
   -> an executable, run exactly as given.
In 4 and 5 mpirun finds the program on each host the way it always does: a bare name through
the PATH the ranks get (dtlaunch forwards the launcher's PATH), a relative path from the working
directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from dtlaunch.core.errors import UsageError

_MODULE_RE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"  # compiled by -m (re's cache)
_PYTHON_RE = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?$")
# Interpreter options that take the next word as their value.
_PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")

SCRIPT, MODULE, PYTHON, EXECUTABLE = "script", "module", "python", "executable"
COMMAND_FORMS = ("SCRIPT.py [ARGS]", "-m MODULE [ARGS]", "python SCRIPT.py [ARGS]",
                 "EXECUTABLE [ARGS]")


@dataclass(frozen=True)
class Program:
    """The ranks' command and what the pre-flight can check about it."""

    argv: tuple[str, ...]
    form: str  # SCRIPT, MODULE, PYTHON or EXECUTABLE
    python: str | None = None  # the interpreter the ranks run, when one can be told
    script: str | None = None  # the script it runs, when one can be told
    module: str | None = None


def check_module_name(module: str) -> str:
    if not re.match(_MODULE_RE, module):
        raise UsageError(f"-m: {module!r} is not a valid module name (e.g. package.module)")
    return module


def is_interpreter(word: str) -> bool:
    return bool(_PYTHON_RE.match(os.path.basename(word)))


def suggest_option(word: str, known: Collection[str]) -> str:
    """'; did you mean --x?' for an unknown option, or ''. An unambiguous prefix counts
    (horovodrun's parser accepts abbreviations)."""
    name = word.split("=", 1)[0]
    starts = sorted(k for k in known if k.startswith(name) and len(name) > 2)
    if len(starts) == 1:
        return f"; did you mean {starts[0]}?"
    import difflib  # only for a mistyped option

    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


@dataclass(frozen=True)
class OptionTable:
    """How many words each of `dtlaunch run`'s options takes (0: a flag), by spelling.

    `short`: the one-letter spellings (`-x`), which may be clustered (`-vx NAME`) or carry their
    value glued on (`-xNAME`); `long`: the others (`--env`, `-np`, `-hostfile`), which may carry
    theirs after '=' (`--env=NAME`). `program_follows`: options after whose value the program's
    own words begin (`-m MODULE`, as for `python -m`)."""

    short: Mapping[str, int]
    long: Mapping[str, int]
    program_follows: Collection[str] = ()


def split_program(words: Sequence[str], table: OptionTable) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`dtlaunch run`'s words as (its own options, the program's words).

    The program begins at the first word that is neither an option nor an option's value, right
    after `-m MODULE`, or after a `--` (which is dropped); from there on every word is the
    program's, however much it looks like one of dtlaunch's options. Options are read the way
    the CLI's parser (click) reads them; an unknown one stays with dtlaunch's part, to be refused."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return tuple(words[:i]), tuple(words[i + 1:])
        if not word.startswith("-") or word == "-":
            break
        name, equals, _ = word.partition("=")
        if name in table.long:
            i += 1 + (0 if equals else table.long[name])
            if name in table.program_follows:
                break
            continue
        i += 1
        if word.startswith("--"):
            continue  # unknown: refused later
        for at, letter in enumerate(word[1:], start=2):
            spelling = "-" + letter
            takes = table.short.get(spelling, 0)
            if takes:  # the rest of the word is its (first) value
                i += takes - (1 if at < len(word) else 0)
                if spelling in table.program_follows:
                    return tuple(words[:i]), tuple(words[i:])
                break
    return tuple(words[:i]), tuple(words[i:])


def python_target(words: Sequence[str]) -> tuple[str | None, str | None]:
    """(script, module) that `python WORDS...` runs, from the interpreter's own options."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-m":
            return None, words[i + 1] if i + 1 < len(words) else None
        if word.startswith("-m") and not word.startswith("--"):
            return None, word[2:]
        if word == "-" or (word.startswith("-c") and not word.startswith("--")):
            return None, None
        if word in _PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return word, None
    return None, None


def parse_command(words: Sequence[str], *, python: str, module: str | None = None,
                  python_given: bool = False, is_file: Callable[[str], bool] = lambda path: True,
                  known_options: Collection[str] = ()) -> Program:
    """The Program for `dtlaunch run [OPTIONS] WORDS...` (see the module's rule).

    python: the interpreter for the shorthand and -m (`--python`, default dtlaunch's own);
    python_given: whether the user named it with --python."""
    if module is not None:
        module = check_module_name(module)
        return Program((python, "-m", module, *words), MODULE, python, None, module)
    if not words:
        raise UsageError("run: missing the command; give one of: " + ", ".join(COMMAND_FORMS))
    first, rest = words[0], tuple(words[1:])
    if first.startswith("-") and first != "-":
        raise UsageError(f"run: unknown option {first}{suggest_option(first, known_options)}")
    if first.endswith(".py") and not is_interpreter(first):
        if not is_file(first):
            raise UsageError(f"run: script not found: {first} (for a script only the hosts have, "
                             f"name the interpreter: python {first})")
        return Program((python, first, *rest), SCRIPT, python, first)
    if is_interpreter(first):
        if python_given:
            raise UsageError(f"--python: the command names its interpreter ({first}); "
                             "drop --python, or start the command with the script")
        script, target = python_target(rest)
        return Program((first, *rest), PYTHON, first, script, target)
    # A wrapper (`nsys profile python train.py`): the pre-flight checks the inner interpreter.
    for i, word in enumerate(rest):
        if is_interpreter(word):
            script, target = python_target(rest[i + 1:])
            return Program((first, *rest), EXECUTABLE, word, script, target)
    return Program((first, *rest), EXECUTABLE, python if python_given else None)
