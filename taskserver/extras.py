"""Optional dependencies: which extra of pyproject.toml installs a module, and the one line
a command prints (exit status 2) when a module it needs is missing.

Commands check before their long work starts (a profile run, minutes of simulation, a
gateway's start), so a missing extra costs one line, not a traceback after the work.
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["EXTRAS", "missing_module", "needs"]

EXTRAS = {
    "onnxruntime": "onnx",
    "matplotlib": "sim",
    "torch": "models",
    "onnx": "models",
    "kubernetes": "k8s",
    "locust": "load",
    "psycopg": "postgres",
}
"""Importable module -> the pyproject extra that installs it."""


def missing_module(module: str) -> bool:
    """The module does not import here (absent, blocked, or failing as it loads).

    It is imported, not only looked up: an install that fails on import is as missing as
    none, and the command that asks imports it next anyway.
    """
    try:
        if importlib.util.find_spec(module) is None:
            return True
        importlib.import_module(module)
    except (ImportError, ValueError):  # ValueError: blocked (sys.modules[module] is None)
        return True
    return False


def needs(command: str, *modules: str) -> str | None:
    """None when every module imports; else the line naming the first missing one's extra.

    ``needs("tailgate profile", "onnxruntime")`` ->
    ``tailgate profile: needs onnxruntime: pip install -e '.[onnx]'``.
    """
    for module in modules:
        if missing_module(module):
            extra = EXTRAS.get(module)
            install = f"pip install -e '.[{extra}]'" if extra else f"pip install {module}"
            return f"{command}: needs {module}: {install}"
    return None
