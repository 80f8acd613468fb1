"""Horovod's own parser as the oracle for horovodrun's flags and config files, and values the
property tests draw for its settings."""

from __future__ import annotations

import sys
from typing import Any
from unittest import mock

from hypothesis import strategies as st

from dtlaunch.horovod.settings import FLOAT, INT, LEVEL, LOG_LEVELS, SETTING_BY_DEST

NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789_./", min_size=1, max_size=12).filter(
    lambda s: not s.startswith("-"))


def oracle_env(argv: list[str]) -> dict[str, str]:
    """The HOROVOD_* variables horovodrun 0.28.1 itself sets for `horovodrun ARGV python train.py`."""
    from horovod.runner import launch
    from horovod.runner.common.util import config_parser

    with mock.patch.object(sys, "argv", ["horovodrun", "-np", "1", *argv, "python", "train.py"]):
        args = launch.parse_args()
    env: dict[str, str] = {}
    config_parser.set_env_from_args(env, args)
    return env


def value_for(type_: str, setting_dest: str) -> st.SearchStrategy[Any]:
    """Values horovodrun takes for a setting, within the limits dtlaunch holds it to."""
    limit = SETTING_BY_DEST[setting_dest].maximum if setting_dest in SETTING_BY_DEST else None
    if type_ == INT:
        return st.integers(0, min(10**6, int(limit if limit is not None else 10**6)))
    if type_ == FLOAT:
        return st.floats(0, min(1e6, limit if limit is not None else 1e6), allow_nan=False,
                         allow_infinity=False)
    if type_ == LEVEL:
        return st.sampled_from(LOG_LEVELS)
    return NAME
