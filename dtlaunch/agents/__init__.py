"""The probe's own files, sent to each host as text and run there (see dtlaunch.probe.command).

They run under whatever interpreter and shell the host has: the Python files keep to
Python >= 3.6 (no `from __future__ import annotations`, typing's generic aliases) and the
standard library; the shell files keep to POSIX sh.
"""
