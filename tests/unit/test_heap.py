"""`settle_heap`: what is alive at start-up leaves the collector's sight, once set up."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from taskserver.heap import YOUNG_THRESHOLD, settle_heap


@pytest.fixture
def gc_state() -> Iterator[None]:
    """The collector as it was, afterwards (the test process's own heap is not frozen)."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("gc_state")
def test_settling_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    settle_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    later = [[i] for i in range(100)]  # a service started later in the same process
    settle_heap()
    assert gc.get_freeze_count() >= frozen + len(later)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("gc_state")
def test_a_higher_threshold_already_set_is_kept() -> None:
    gc.set_threshold(50_000, 10, 10)
    settle_heap()
    assert gc.get_threshold()[0] == 50_000
