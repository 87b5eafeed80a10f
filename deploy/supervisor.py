"""When ``tailgate up`` restarts a child that died: a pure policy (time comes in as ``now``).

The rule, by phase of ``up`` (``Phase``):

- *starting* (``up`` waits for its children to register): any exit is fatal. A child that
  cannot start at all (a bad argument, a port in use) would otherwise restart forever, so
  ``up`` fails fast, exits non-zero and names the child.
- *running* (everything came up once): like systemd's ``Restart=on-failure``. A failure (a
  non-zero exit code, or death by a signal such as SIGKILL from ``kill -9`` or the OOM killer)
  is restarted after a backoff; a clean exit stays down: exit code 0, or SIGHUP, SIGINT,
  SIGTERM or SIGPIPE (someone stopped it on purpose, or a task server retired when idle,
  Swayam's self-decommission). One child's death never stops the others.
- *stopping* (Ctrl-C or SIGTERM of ``up``): nothing is restarted.

The backoff (``RestartPolicy``, numbers below): the first restart after 0.5 s, doubling per
consecutive failure up to 30 s, each delay jittered by ±20% from an injected
``random.Random`` (so children that die together do not come back in lockstep; the
largest delay is therefore 36 s). A child that stayed up for 10 s before it died counts as
healthy again: its next restart starts over at 0.5 s. A start limit in the manner of
systemd's StartLimitBurst/StartLimitIntervalSec catches a crash loop that this reset hides:
more than 5 failures within 60 s and every restart waits the full 30 s (jittered), and the
decision says so, for the shell to log loudly. Unlike systemd, hitting the limit never gives
up: the rest keeps serving and the child keeps being retried.
"""

from __future__ import annotations

import enum
import random
import signal
from collections import deque
from dataclasses import dataclass

__all__ = [
    "CLEAN_SIGNALS",
    "Action",
    "Phase",
    "RestartBackoff",
    "RestartDecision",
    "RestartPolicy",
    "describe_exit",
    "is_clean_exit",
]

CLEAN_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE})
"""Signals whose death counts as a clean exit (systemd's list for Restart=on-failure)."""


class Phase(enum.Enum):
    """Where ``tailgate up`` is in its life."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"


class Action(enum.Enum):
    """What to do about a child that exited."""

    RESTART = "restart"
    """Start it again after ``delay_s``."""
    FATAL = "fatal"
    """It died during start-up: ``up`` gives up, non-zero."""
    STAY_DOWN = "stay-down"
    """A clean exit while running: leave it down."""
    IGNORE = "ignore"
    """``up`` is stopping: the exit is expected."""


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Backoff and start-limit numbers; every default is what ``tailgate up`` uses."""

    initial_delay_s: float = 0.5
    """Delay before the first restart after a failure (before jitter)."""
    multiplier: float = 2.0
    """Each consecutive failure multiplies the delay by this."""
    max_delay_s: float = 30.0
    """Cap of the delay before jitter."""
    jitter: float = 0.2
    """Each delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]."""
    stable_after_s: float = 10.0
    """A child up for this long before it dies starts over at initial_delay_s."""
    start_limit_burst: int = 5
    """More failures than this within start_limit_interval_s: restart at max_delay_s, loudly."""
    start_limit_interval_s: float = 60.0
    """The window of the start limit."""

    def __post_init__(self) -> None:
        """Raise ValueError naming the bad field."""
        if not 0 < self.initial_delay_s <= self.max_delay_s:
            raise ValueError(
                f"initial_delay_s: must be > 0 and <= max_delay_s ({self.max_delay_s}), "
                f"got {self.initial_delay_s}"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier: must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter: must be in [0, 1), got {self.jitter}")
        if self.stable_after_s < 0:
            raise ValueError(f"stable_after_s: must be >= 0, got {self.stable_after_s}")
        if self.start_limit_burst < 1:
            raise ValueError(f"start_limit_burst: must be >= 1, got {self.start_limit_burst}")
        if self.start_limit_interval_s <= 0:
            raise ValueError(
                f"start_limit_interval_s: must be > 0, got {self.start_limit_interval_s}"
            )


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """The verdict on one exit."""

    action: Action
    status: str
    """How it ended, for people: "exit code 2", "killed by SIGKILL"."""
    delay_s: float = 0.0
    """With RESTART: wait this long, then start it again."""
    restart: int = 0
    """With RESTART: which restart of this child this is (1 for the first)."""
    failures: int = 0
    """Consecutive failures, this one included (the backoff's exponent + 1)."""
    recent_failures: int = 0
    """Failures within the start limit's window, this one included."""
    limited: bool = False
    """The start limit is hit: the child is crash-looping."""


def describe_exit(returncode: int | None) -> str:
    """A process's exit status in words (None: it could not be started at all)."""
    if returncode is None:
        return "could not be started"
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def is_clean_exit(returncode: int | None) -> bool:
    """Exit code 0 or death by one of CLEAN_SIGNALS (None, not started, is a failure)."""
    if returncode is None:
        return False
    if returncode >= 0:
        return returncode == 0
    return -returncode in {int(s) for s in CLEAN_SIGNALS}


class RestartBackoff:
    """One child's restart state: consecutive failures, recent failures, restarts so far."""

    def __init__(self, policy: RestartPolicy, rng: random.Random) -> None:
        self.policy = policy
        self._rng = rng
        self.failures = 0
        """Consecutive failures (reset by a stable run)."""
        self.restarts = 0
        """Restarts decided so far, over the child's whole life."""
        self.started_s: float | None = None
        self._recent: deque[float] = deque()

    def started(self, now: float) -> None:
        """The child (re)started at `now`."""
        self.started_s = now

    def decide(self, returncode: int | None, now: float, phase: Phase) -> RestartDecision:
        """Record an exit at `now` (None: a start that failed) and say what to do about it."""
        status = describe_exit(returncode)
        if phase is Phase.STOPPING:
            return RestartDecision(Action.IGNORE, status)
        if phase is Phase.STARTING:
            return RestartDecision(Action.FATAL, status)
        if is_clean_exit(returncode):
            return RestartDecision(Action.STAY_DOWN, status)
        p = self.policy
        if self.started_s is not None and now - self.started_s >= p.stable_after_s:
            self.failures = 0
        self.failures += 1
        self._recent.append(now)
        while self._recent[0] <= now - p.start_limit_interval_s:
            self._recent.popleft()
        limited = len(self._recent) > p.start_limit_burst
        if limited:
            nominal_s = p.max_delay_s
        else:
            # the exponent is capped so that a long crash loop cannot overflow the float
            growth = p.multiplier ** min(self.failures - 1, 64)
            nominal_s = min(p.max_delay_s, p.initial_delay_s * growth)
        delay_s = nominal_s * (1.0 + p.jitter * (2.0 * self._rng.random() - 1.0))
        self.restarts += 1
        self.started_s = None  # until the shell says it started again
        return RestartDecision(
            Action.RESTART,
            status,
            delay_s=delay_s,
            restart=self.restarts,
            failures=self.failures,
            recent_failures=len(self._recent),
            limited=limited,
        )
