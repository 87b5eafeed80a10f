"""Dropping policies by name: the PARD family, its Table 1 ablations and the §5.1 baselines."""

from __future__ import annotations

from taskserver.pard.abc import Dropper
from taskserver.pard.ablations import (
    FixedSplitBroker,
    OverloadControlBroker,
    WorstCaseSplitBroker,
)
from taskserver.pard.baselines import ClipperPlusPlus, NexusDropper, NoDropper
from taskserver.pard.broker import Estimator, RequestBroker
from taskserver.pard.depq import QueueOrder
from taskserver.pard.load import PriorityConfig
from taskserver.pard.state import StatePlanner

__all__ = ["DROPPER_NAMES", "create_dropper"]

# name -> (estimate of eq. 3, queue order) for the PARD family
_PARD_FAMILY: dict[str, tuple[Estimator, QueueOrder]] = {
    "pard": (Estimator.FULL, QueueOrder.ADAPTIVE),
    "back": (Estimator.BACK, QueueOrder.ADAPTIVE),
    "sf": (Estimator.SF, QueueOrder.ADAPTIVE),
    "lower": (Estimator.LOWER, QueueOrder.ADAPTIVE),
    "upper": (Estimator.UPPER, QueueOrder.ADAPTIVE),
    "fcfs": (Estimator.FULL, QueueOrder.FCFS),
    "hbf-only": (Estimator.FULL, QueueOrder.HBF),
    "lbf-only": (Estimator.FULL, QueueOrder.LBF),
    "instant-switch": (Estimator.FULL, QueueOrder.INSTANT),
}

# name -> PARD with another drop test in place of eq. (3) (Table 1: PARD-oc, -split, -WCL)
_REPLACED_TEST: dict[str, type[RequestBroker]] = {
    "oc": OverloadControlBroker,
    "split": FixedSplitBroker,
    "wcl": WorstCaseSplitBroker,
}

DROPPER_NAMES: tuple[str, ...] = ("none", "nexus", "clipper++", *_PARD_FAMILY, *_REPLACED_TEST)

# Table 1 spells the ablations "PARD-<x>".
_ALIASES = {"pard-hbf": "hbf-only", "pard-lbf": "lbf-only", "clipper": "clipper++"}


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key.startswith("pard-") and (key[5:] in _PARD_FAMILY or key[5:] in _REPLACED_TEST):
        key = key[5:]
    return key


def create_dropper(
    name: str,
    planner: StatePlanner | None = None,
    *,
    priority: PriorityConfig | None = None,
) -> Dropper:
    """The dropping policy called `name`; every one but 'none' and 'nexus' needs the planner."""
    key = _canonical(name) if isinstance(name, str) else name
    if key == "none":
        return NoDropper()
    if key == "nexus":
        return NexusDropper()
    if key not in DROPPER_NAMES:
        valid = ", ".join(repr(n) for n in DROPPER_NAMES)
        raise ValueError(f"dropper name: unknown {name!r}, expected one of {valid}")
    if planner is None:
        raise ValueError(f"dropper planner: {key!r} needs a StatePlanner, got None")
    if key == "clipper++":
        return ClipperPlusPlus(planner)
    if key in _REPLACED_TEST:
        return _REPLACED_TEST[key](planner, priority=priority, name=key)
    estimator, order = _PARD_FAMILY[key]
    return RequestBroker(planner, estimator=estimator, order=order, priority=priority, name=key)
