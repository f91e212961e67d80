"""Small matplotlib charts as ``data:image/svg+xml`` URIs, so the page needs nothing outside itself.

SVG text stays text (``svg.fonttype = none``), which keeps a chart to a few kilobytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

Series = Mapping[str, tuple[Sequence[float], Sequence[float | None]]]  # label -> (xs, ys)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _uri(fig) -> str:
    plt = _plt()
    buf = io.BytesIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sage-rl-view"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _axes(title: str, xlabel: str, ylabel: str = ""):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 2.7))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    return fig, ax


def line_chart(
    title: str, xlabel: str, series: Series, ylabel: str = "", ylim: tuple[float, float] | None = None
) -> str | None:
    """One line per series (points with a None value are skipped); None when there is no point."""
    drawn = {k: [(x, y) for x, y in zip(*v, strict=True) if y is not None] for k, v in series.items()}
    drawn = {k: v for k, v in drawn.items() if v}
    if not drawn:
        return None
    fig, ax = _axes(title, xlabel, ylabel)
    for label, points in drawn.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.4, label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylim:
        ax.set_ylim(*ylim)
    if len(drawn) > 1:
        ax.legend(fontsize=7)
    return _uri(fig)


def bar_chart(title: str, bars: Mapping[str, float], ylabel: str = "", ylim=None) -> str | None:
    if not bars:
        return None
    fig, ax = _axes(title, "", ylabel)
    ax.bar(list(bars), list(bars.values()), color="#4c78a8", width=min(0.8, 0.25 * len(bars)))
    ax.tick_params(axis="x", labelrotation=20)
    if ylim:
        ax.set_ylim(*ylim)
    return _uri(fig)
