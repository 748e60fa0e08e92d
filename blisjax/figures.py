"""Matplotlib figures without pyplot's global state, written as PNG atomically.

Every plot of the project (autoscaling replicas, search and sweep plots, decision-trace plots)
draws on a ``new_figure`` (Agg canvas) and writes it with ``save_png``: no ``Software``
metadata, so the same figure gives the same bytes run after run.
"""

from __future__ import annotations

import io
from pathlib import Path

from blisjax.atomicio import write_bytes_atomic


def new_figure(width_in: float = 6.4, height_in: float = 4.2, dpi: int = 100):
    """A ``matplotlib.figure.Figure`` of ``width_in`` × ``height_in`` inches on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as PNG, atomically; returns the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    write_bytes_atomic(path, buf.getvalue())
    return Path(path)
