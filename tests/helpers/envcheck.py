"""This machine's healthy facts and env-check's rows, shared by env-check's and the GPU probe's tests."""

from __future__ import annotations

from typing import Any

from helpers.facts import host_facts, python_facts

PY = python_facts(module_found=None)  # env-check looks for no script or module
HOST = host_facts("me", python=PY, ifaces=None, script_exists=None)


def rows(items: Any, section: str) -> list[tuple[str, str, str]]:
    return [(i.check.name, i.check.status, i.check.detail) for i in items if i.section == section]
