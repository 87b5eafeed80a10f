"""TAILGATE_PURE_PYTHON=1 makes a fresh process run the Python twins of the C extensions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from taskserver.native import PURE_PYTHON_ENV, require_native
from tests.conftest import REPO_ROOT

PROBE = (
    "import taskserver.framecheck as f, gateway.hotpath as h, gateway.cdf as c; "
    "print(f.IMPLEMENTATION, h.IMPLEMENTATION, c._SlotIndex is None, c._crossing is c._crossing_py)"
)


def _probe(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_switch_selects_every_python_twin() -> None:
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    assert _probe({**env, PURE_PYTHON_ENV: "1"}) == "python python True True"
    native = _probe(env)
    if native.split()[0] == "python":
        pytest.skip("the C extensions are not built here")
    assert native == "c c False False"


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_require_native_refuses_when_asked(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(PURE_PYTHON_ENV, value)
    with pytest.raises(ImportError, match=PURE_PYTHON_ENV):
        require_native()


@pytest.mark.parametrize("value", ["", "0", "no"])
def test_require_native_allows_otherwise(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(PURE_PYTHON_ENV, value)
    require_native()
