"""Whether the optional C extensions may be loaded.

Tailgate's C extensions (``taskserver/_framecheck.c``, ``gateway/_hotpath.c``) each have a
pure-Python twin that runs where the extension was not built. ``TAILGATE_PURE_PYTHON=1``
makes every process run the twins even where the extensions are built, so that the whole
test suite can be run on both paths (README: Benchmarks, the gateway's hot path).
"""

from __future__ import annotations

import os

__all__ = ["PURE_PYTHON_ENV", "require_native"]

PURE_PYTHON_ENV = "TAILGATE_PURE_PYTHON"


def require_native() -> None:
    """Raise ImportError when the pure-Python twins are asked for (put it first in the `try`
    that imports an extension, so the same `except ImportError` takes the Python path)."""
    if os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        raise ImportError(f"{PURE_PYTHON_ENV} is set: the pure-Python twins run")
