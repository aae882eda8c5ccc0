"""The installed modeldsl version, as ``--version`` of the command-line tools prints it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def modeldsl_version() -> str:
    """The version of the installed ``modeldsl`` distribution (from its metadata)."""
    try:
        return version("modeldsl")
    except PackageNotFoundError:
        return "unknown (not installed)"
