"""Matplotlib figures as inline SVG for the HTML report: text stays text, ids stay unique, labels are findable.

Every figure of the report goes through :func:`new_figure` and :func:`to_svg`:

- ``svg.fonttype: none``: labels, ticks and legends are ``<text>`` elements (searchable, sharp at any zoom);
  dense scatters are rasterised by the caller (``rasterized=True``) so the file stays small;
- each figure's element ids get the figure's own prefix, so several SVGs live in one page;
- every axis label becomes ``<g id="<fig>-xlabel-<i>" class="axis-label x-label">`` (``y-label`` likewise),
  which the render test looks for; the ``<svg>`` itself carries ``class="plot"`` and the title.

>>> fig, (ax,) = new_figure(3, 2)
>>> _ = ax.plot([1, 2], [3, 4]); _ = ax.set_xlabel("t (s)"); _ = ax.set_ylabel("RTT (ms)")
>>> svg = to_svg(fig, "f1", "demo")
>>> svg.startswith('<svg class="plot" id="f1"'), 'class="axis-label x-label"' in svg, "<text" in svg
(True, True, True)
"""

from __future__ import annotations

import html
import io
import re
from typing import Any

RC: dict[str, Any] = {  # set process-wide by new_figure: every figure of the report looks the same
    "svg.fonttype": "none",
    "font.size": 11.0,
    "axes.titlesize": 12.0,
    "axes.labelsize": 11.0,
    "legend.fontsize": 10.0,
    "xtick.labelsize": 10.0,
    "ytick.labelsize": 10.0,
    "axes.grid": True,
    "grid.alpha": 0.3,
}
_PROLOGUE = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_STYLE = re.compile(r"<defs>\s*<style[^>]*>.*?</style>\s*</defs>\s*", re.S)
_SIZE = re.compile(r'<svg ([^>]*?)width="([\d.]+)pt" height="([\d.]+)pt"')


def new_figure(width_in: float, height_in: float, nrows: int = 1, ncols: int = 1, **kw: Any) -> tuple[Any, list[Any]]:
    """(figure, flat list of axes) with the report's style; the Agg backend, so no display is needed."""
    # Late on purpose: matplotlib (~0.5 s) loads only when a report is drawn, and the backend must be
    # chosen before pyplot is first imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(RC)  # type: ignore[arg-type]  # matplotlib types the keys as a Literal
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), squeeze=False, **kw)
    return fig, [ax for row in axes for ax in row]


def _tag_labels(fig: Any) -> None:
    for i, ax in enumerate(fig.axes):
        if ax.get_xlabel():
            ax.xaxis.label.set_gid(f"xlabel-{i}")
        if ax.get_ylabel():
            ax.yaxis.label.set_gid(f"ylabel-{i}")


def to_svg(fig: Any, fig_id: str, title: str) -> str:
    """The figure as an ``<svg>`` element for inline use (the figure is closed afterwards)."""
    import matplotlib.pyplot as plt  # late: see new_figure

    _tag_labels(fig)
    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": fig_id}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = _STYLE.sub("", _METADATA.sub("", _PROLOGUE.sub("", buf.getvalue(), count=1), count=1), count=1)
    text = re.sub(r'id="([^"]+)"', rf'id="{fig_id}-\1"', text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{fig_id}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{fig_id}-\1)", text)
    text = re.sub(rf'<g id="({fig_id}-([xy])label-\d+)"', r'<g id="\1" class="axis-label \2-label"', text)
    size = _SIZE.search(text)
    if size is None:
        raise ValueError("to_svg: matplotlib wrote an <svg> without a width and height in pt")
    width_px = float(size.group(2)) * 4.0 / 3.0
    head = (f'<svg class="plot" id="{fig_id}" role="img" aria-label="{html.escape(title)}" '
            f'style="max-width:{width_px:.0f}px" {size.group(1)}')
    return head + text[size.end():]
