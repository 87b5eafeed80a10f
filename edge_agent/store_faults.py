"""What the sensor store does about its file's faults: emptied, corrupt, or on a full disk.

- An empty (zero-byte) store file is refused unless the agent is told to start a new
  store in it (``--init-store``): SQLite would take it for a new database, and would even
  delete a ``-wal`` file beside it, so a truncated store would lose the agent's history
  without a word.
- A store that fails its integrity check, or is not a SQLite file at all, stops the agent
  with one line that says how to recover (`recovery_hint`).
- A full disk fails a write with SQLITE_FULL: the transaction is rolled back, every
  committed row stays, reads go on. The store first tries to give the space its
  write-ahead log holds back (a truncating checkpoint), then raises `StoreFull`; writes
  resume by themselves once space is freed.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

__all__ = [
    "INIT_OPTION",
    "SQLITE_CORRUPT",
    "SQLITE_FULL",
    "SQLITE_NOTADB",
    "describe_full",
    "empty_store_problem",
    "is_corrupt",
    "is_disk_full",
    "recovery_hint",
]

INIT_OPTION = "--init-store"
"""The agent's option that allows a new store in an empty file (`AgentConfig.init_store`)."""
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_NOTADB = 26


def _primary_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of a driver error, or of the SQLAlchemy error around it."""
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_disk_full(exc: BaseException) -> bool:
    """Whether a store error was SQLITE_FULL (the disk, or the database's size limit)."""
    return _primary_code(exc) == SQLITE_FULL


def is_corrupt(exc: BaseException) -> bool:
    """Whether a store error says the file is damaged or not a database at all."""
    return _primary_code(exc) in (SQLITE_CORRUPT, SQLITE_NOTADB)


def recovery_hint(path: str | Path) -> str:
    """How to recover a store that fails its check, as one line of shell an operator runs."""
    db = shlex.quote(str(path))
    bad = shlex.quote(f"{path}.corrupt")
    wal, bad_wal = shlex.quote(f"{path}-wal"), shlex.quote(f"{path}.corrupt-wal")
    return (
        f"to recover: stop the agent, move the store aside with its write-ahead log "
        f"(mv {db} {bad}; mv {wal} {bad_wal} if it exists), then restore a backup to {db}, "
        f"or salvage what is readable with `tailgate edge-agent salvage --from {bad} "
        f"--db {db}`, and start the agent again"
    )


def empty_store_problem(path: str | Path, *, init: bool) -> str | None:
    """Why the store file at `path` may not be opened, or None.

    Only an existing zero-byte file is a problem, and only without `init`: a missing file
    is a new store (the agent's first start), a non-empty one is checked by SQLite.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError:
        return None  # missing (a new store), or SQLite says what is wrong when it opens it
    if size != 0 or init or not p.is_file():
        return None
    wal = Path(f"{p}-wal")
    try:
        wal_bytes = wal.stat().st_size
    except OSError:
        wal_bytes = 0
    kept = (
        f"; keep {wal} ({wal_bytes} bytes): it may hold the latest readings, and a new store "
        f"would delete it"
        if wal_bytes
        else ""
    )
    return (
        f"db {p}: the store file is empty (0 bytes), as a truncated store would be; starting "
        f"on it would lose the agent's history without a word. Restore it from a backup, "
        f"or start with {INIT_OPTION} to begin a new, empty store in it{kept}"
    )


def describe_full(where: str, what: str, detail: Any) -> str:
    """The message of a write that a full disk refused."""
    return (
        f"db {where}: {what} refused, the disk is full ({detail}): every committed reading "
        f"is kept and reads go on; writes resume once space is freed on the store's disk"
    )
