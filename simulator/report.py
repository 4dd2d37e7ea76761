"""`simulate report`: one self-contained HTML page of plotly figures for a run folder or a sweep file.

The figures themselves live in `simulator.figures`, imported when a page is drawn.
"""

from __future__ import annotations

import html
import webbrowser
from pathlib import Path

import click

from simulator.errors import InputError


def write_report(source: Path, out: Path | None = None) -> Path:
    """The report of a run folder or a sweep file; returns the page written."""
    from simulator.figures import run_figures, sweep_figures, sweep_notes, write_page

    if not source.exists():
        raise InputError(f"{str(source)!r} does not exist")
    if source.is_dir():
        saved, figures = run_figures(source)
        settings, summary = saved["settings"], saved["summary"]
        intro = (f"<p>{html.escape(str(source))}: policy {html.escape(str(settings['policy']))}, "
                 f"{summary['completed']} of {summary['arrived']} requests completed, "
                 f"{summary['request_throughput']:.3f} req/s.</p>")
        out = out or source / "report.html"
        write_page(out, f"servesim run {source.name}", intro, figures)
    else:
        rows, figures = sweep_figures(source)
        out = out or source.with_suffix(".html")
        write_page(out, f"servesim sweep {source.name}", sweep_notes(rows), figures)
    return out


@click.command("report")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="HTML file [default: report.html in a run folder, FILE.html beside a sweep file].")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a browser.")
def report_command(path: Path, out: Path | None, open_page: bool) -> None:
    """One self-contained HTML page of figures for a run folder or a sweep file."""
    page = write_report(path, out)
    click.echo(f"wrote {page}")
    if open_page:
        webbrowser.open(page.resolve().as_uri())
