"""What every report page shares: the page itself (plotly.js inlined, written atomically), its
style, HTML tables with every cell escaped, and summary numbers checked and formatted for display.
Values come from files someone may have shared: they are escaped here, never trusted."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.errors import InputError, clip
from simulator.outputs.run_folder import atomic_file

if TYPE_CHECKING:  # plotly loads when a page is drawn
    import plotly.graph_objects as go

PAGE_STYLE = ("body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;margin:0.5em 0 1em}"
              "td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd} th:first-child,"
              "td:first-child{text-align:left} .verdict{font-size:1.2em;padding:0.5em;border-left:6px solid}"
              " .bad{border-color:#d62728;background:#fdecea} .good{border-color:#2ca02c;background:#eaf6ea}"
              " .unsure{border-color:#ff7f0e;background:#fff4e5}")


def shown(value: object) -> str:
    """A value from a file, quoted and cut short for an error line."""
    return clip(repr(value))


def number(value: object) -> float | None:
    """A summary number as `outputs.json_safe` writes it (NaN as null, infinities as "inf"); None if not a number."""
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def fmt(value: object, spec: str) -> str:
    """A checked summary number for display: '-' for none (null, NaN, missing)."""
    x = number(value)
    return "-" if x is None or math.isnan(x) else format(x, spec)


def milliseconds(seconds: object) -> str:
    x = number(seconds)
    return "-" if x is None or math.isnan(x) else f"{x * 1e3:.2f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """An HTML table of plain strings, every cell escaped."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def color_cycle() -> Any:
    import itertools

    import plotly.colors

    return itertools.cycle(plotly.colors.qualitative.Plotly)


def write_page(path: Path, title: str, intro: str, figures: dict[str, go.Figure], subject: str | None = None) -> None:
    """One HTML file with plotly.js inlined (no network needed), written atomically.

    `intro` is HTML the caller has escaped. A path that cannot be written is an `InputError` that
    starts with `subject` (how the user named the file; the quoted path by default).
    """
    parts = []
    for i, (name, fig) in enumerate(figures.items()):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=name,
                                 config={"responsive": True}))
    page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{PAGE_STYLE}</style></head>\n"
            f"<body><h1>{html.escape(title)}</h1>{intro}\n" + "\n".join(parts) + "\n</body></html>\n")
    subject = subject or repr(str(path))
    if path.is_dir():
        raise InputError(f"{subject} is a folder; name the HTML file to write, e.g. {str(path / 'report.html')!r}")
    try:
        with atomic_file(path) as partial:
            partial.write_text(page)
    except OSError as exc:
        raise InputError(f"{subject} cannot be written ({exc.strerror or exc})") from None
