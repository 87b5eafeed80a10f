"""The Tailbench service-time tables shipped with the simulator, and their short names.

A scenario's or a command's service-time file may be given as ``tailbench:APP`` (APP one of
`APPS`): the shipped ``data/tailbench/APP_quantiles.txt``, wherever the package is installed
and whatever the working directory. Any other text is a path, as given.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["APPS", "PREFIX", "TAILBENCH_DIR", "resolve_table", "table_path"]

TAILBENCH_DIR = Path(__file__).resolve().parent / "data" / "tailbench"
"""The shipped tables (see its README.md for their source)."""
APPS = ("masstree", "shore", "xapian")
"""The applications whose tables ship."""
PREFIX = "tailbench:"
"""Prefix of a shipped table's short name (``tailbench:xapian``)."""


def table_path(app: str, data_dir: Path = TAILBENCH_DIR) -> Path:
    """The quantile table of `app` in `data_dir` (default: the shipped folder)."""
    return data_dir / f"{app}_quantiles.txt"


def resolve_table(text: str) -> str:
    """``tailbench:APP`` as the shipped table's path; any other text unchanged.

    ValueError names the known applications when APP is not one of them.
    """
    if not text.startswith(PREFIX):
        return text
    app = text.removeprefix(PREFIX)
    if app not in APPS:
        raise ValueError(f"no shipped Tailbench table {text!r} (known: {', '.join(APPS)})")
    return str(table_path(app))
