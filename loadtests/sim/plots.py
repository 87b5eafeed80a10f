"""PNG figures of the experiments (matplotlib, imported lazily with the Agg backend).

The functions take plain data (panel title -> series -> values), so the
experiments decide what to show and this module only how.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Points = Sequence[tuple[float, float]]
"""(x, y) pairs of one line."""


def missing() -> str | None:
    """None when figures can be drawn; else one line naming the extra to install (checked
    before an experiment starts, not after its minutes of simulation)."""
    from taskserver.extras import missing_module

    if missing_module("matplotlib"):
        return "the experiments' figures need matplotlib: pip install -e '.[sim]'"
    return None


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, n: int, ncols: int, width: float, height: float) -> tuple[Any, list[Any]]:
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _label(
    ax: Any, title: str, xlabel: str, ylabel: str, grid_axis: str = "both", ncols: int = 1
) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis=grid_axis, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an empty legend would warn
        ax.legend(fontsize="small", ncols=ncols, loc="upper left")


NOTE_WIDTH = 110
"""Characters per line of a figure's note."""


def _save(plt: Any, fig: Any, path: Path, title: str, note: str = "") -> None:
    """Title the figure and write it; a note (an UNJUDGED warning) goes in red under the
    title and into the PNG's Description, so the figure cannot be read without it."""
    if note:
        import textwrap

        fig.suptitle(title, y=1.0)
        wrapped = textwrap.fill(textwrap.shorten(note, 3 * NOTE_WIDTH), NOTE_WIDTH)
        fig.text(0.5, 0.985, wrapped, ha="center", va="top", color="red", fontsize="small")
        fig.tight_layout(rect=(0, 0, 1, 0.9))
    else:
        fig.suptitle(title)
        fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Description": note} if note else None)
    plt.close(fig)


def line_panels(
    path: Path,
    panels: Mapping[str, Mapping[str, Points]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ncols: int = 3,
    ylim: tuple[float, float] | None = None,
    note: str = "",
) -> None:
    """One panel per key, one marked line per series (note: see `_save`)."""
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels), ncols, 4.4, 3.4)
    for ax, (name, series) in zip(axes, panels.items(), strict=True):
        for label, points in series.items():
            xs, ys = zip(*points, strict=True) if points else ((), ())
            ax.plot(xs, ys, marker="o", label=label)
        if ylim is not None:
            ax.set_ylim(*ylim)
        _label(ax, name, xlabel, ylabel)
    _save(plt, fig, path, title, note)


def grouped_bars(
    path: Path,
    panels: Mapping[str, tuple[Sequence[str], Mapping[str, Sequence[float]]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    refs: Mapping[str, Sequence[float]] | None = None,
    ref_label: str = "SLO",
    ncols: int = 3,
    note: str = "",
) -> None:
    """One panel per key: groups along x, one bar per series; refs draw a mark per group."""
    plt = _pyplot()
    # Wide enough that every bar and group label has room.
    bars = max((len(g) * (len(s) + 1) for g, s in panels.values()), default=1)
    fig, axes = _grid(plt, len(panels), ncols, max(4.6, 0.28 * bars + 1.5), 3.6)
    for ax, (name, (groups, series)) in zip(axes, panels.items(), strict=True):
        width = 0.8 / max(1, len(series))
        for i, (label, values) in enumerate(series.items()):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, values, width=width, label=label)
        for g, ref in enumerate((refs or {}).get(name, ())):
            # A short line across the group: the SLO its bars are judged against.
            ax.hlines(
                ref,
                g - 0.45,
                g + 0.45,
                colors="black",
                linestyles="--",
                label=ref_label if g == 0 else None,
            )
        ax.set_xticks(range(len(groups)), groups)
        # Headroom above the tallest bar for the legend drawn across the top.
        top = max([v for vs in series.values() for v in vs if math.isfinite(v)] or [1.0])
        top = max(top, *(refs or {}).get(name, [0.0]))
        ax.set_ylim(0, 1.45 * top if top > 0 else 1.0)  # all zero: nothing met at any load
        _label(ax, name, xlabel, ylabel, grid_axis="y", ncols=3)
    _save(plt, fig, path, title, note)


def curves_with_slo(
    path: Path,
    panels: Mapping[str, Mapping[str, tuple[Points, float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ncols: int = 3,
    ymax_slo_factor: float = 2.5,
    note: str = "",
) -> None:
    """One panel per key, one curve per series with its SLO as a dashed line of the same colour."""
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels), ncols, 4.4, 3.4)
    for ax, (name, series) in zip(axes, panels.items(), strict=True):
        top = 0.0
        for label, (points, slo_ms) in series.items():
            xs, ys = zip(*points, strict=True) if points else ((), ())
            (line,) = ax.plot(xs, ys, marker=".", label=label)
            ax.axhline(slo_ms, color=line.get_color(), linestyle="--", linewidth=1)
            top = max(top, slo_ms)
        # Far past the SLO the curves shoot up; cut there so the knee stays readable.
        ax.set_ylim(0, ymax_slo_factor * top)
        _label(ax, name, xlabel, ylabel)
    _save(plt, fig, path, title, note)
