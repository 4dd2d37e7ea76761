"""`simulate report`: the command line of a report page (the page itself is `simulator.report.page`).

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click


@click.command("report")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="HTML file [default: report.html in a run folder, FILE.html beside a sweep or compare file].")
@click.option("--open", "open_page", is_flag=True, help="Open the page in a browser.")
def report_command(path: Path, out: Path | None, open_page: bool) -> None:
    """One self-contained HTML page of figures for a run folder, a sweep file or a compare file."""
    from simulator.report.page import write_report

    page = write_report(path, out)
    click.echo(f"wrote {page}")
    if open_page and not opened(page):
        click.echo(f"warning: no browser could be opened (no display?); the page is {page.resolve()}", err=True)


def opened(page: Path) -> bool:
    """Whether a browser took the page: webbrowser says False, or raises, when none can be started."""
    try:
        return webbrowser.open(page.resolve().as_uri())
    except webbrowser.Error:
        return False
