"""Waiting-time model of a central FIFO queue feeding n backends (M/M/n, Erlang C).

Beyond the paper: Swayam §4.5 models random dispatch with retries (`admission.swayam`). When
the gateway instead holds one queue for the pool and hands the head request to the first
free backend (central queueing, TailGuard Fig. 2), the pool is an M/G/n queue. We use the
M/M/n waiting time with the measured mean service time (a standard approximation):

    a = λ / μ,   C(n, a) = P(wait > 0)   (Erlang C),
    P(W > w) = C(n, a) · exp(-(n·μ - λ) · w)   for w >= 0, stable when a < n,

and, as for Swayam's model, convolve it with the measured service-time samples. Pure code.
"""

from __future__ import annotations

import math

__all__ = ["central_waiting_cdf", "erlang_c"]


def erlang_c(n: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/n queue with offered load a = λ/μ (< n)."""
    if offered <= 0:
        return 0.0
    if offered >= n:
        return 1.0
    # Erlang B by its stable recursion, then C = n·B / (n - a·(1 - B)).
    b = 1.0
    for k in range(1, n + 1):
        b = offered * b / (k + offered * b)
    return n * b / (n - offered * (1.0 - b))


def central_waiting_cdf(
    w_ms: float, n: int, rate_per_ms: float, mean_ms: float, wait_prob: float | None = None
) -> float:
    """P(W <= w) for the queueing delay of a central FIFO queue over n backends.

    `wait_prob` is erlang_c(n, rate_per_ms * mean_ms) when the caller already has it: it
    costs O(n), and a convolution asks for many w at the same n.
    """
    if w_ms < 0:
        return 0.0
    offered = rate_per_ms * mean_ms
    if offered >= n:
        return 0.0
    c = erlang_c(n, offered) if wait_prob is None else wait_prob
    return 1.0 - c * math.exp(-(n / mean_ms - rate_per_ms) * w_ms)
