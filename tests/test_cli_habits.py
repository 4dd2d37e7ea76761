"""What a person types by habit: a mistyped verb gets a suggestion (not the default verb's "unexpected
extra argument"), while `simulate --rate 12` still runs the default verb; `report --open` where no
browser can start says so and where the page is."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import pytest

from simulator.cli.main import run


def simulate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


@pytest.mark.parametrize(("word", "said"), [
    ("rnu", "no such command 'rnu' (did you mean 'run'?)"),
    ("batch-tabel", "no such command 'batch-tabel' (did you mean 'batch-table'?)"),
    ("reprot", "no such command 'reprot' (did you mean 'report'?)"),
    ("xyzzy", "no such command 'xyzzy' (the commands are batch-table, calibrate, compare, fit, plan, report, "
              "run, sweep, validate)"),
    ("\u00e9" * 500, "no such command '\u00e9\u00e9\u00e9"),
])
def test_a_mistyped_verb_gets_a_suggestion(word: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate([word, "--rate", "12"], capsys)
    assert code == 2 and out == "" and err.startswith(f"error: {said}") and err.count("\n") == 1
    assert len(err) < 200


def test_options_alone_still_run_the_default_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(["--rate", "12", "--num-requests", "5", "--no-tokens", "--quiet", "--out",
                               str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert (tmp_path / "run" / "summary.json").exists() and "TTFT" in out
    code, out, _ = simulate(["run", "--help"], capsys)
    assert code == 0 and out.startswith("Usage: simulate run [OPTIONS]")


def test_report_open_without_a_browser_says_where_the_page_is(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = simulate(["--rate", "12", "--num-requests", "5", "--no-tokens", "--quiet", "--out",
                             str(tmp_path / "run")], capsys)
    assert code == 0, err
    asked: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: asked.append(url) or False)  # no display, no text browser
    code, out, err = simulate(["report", str(tmp_path / "run"), "--open"], capsys)
    page = (tmp_path / "run" / "report.html").resolve()
    assert code == 0 and out == f"wrote {tmp_path / 'run' / 'report.html'}\n"
    assert err == f"warning: no browser could be opened (no display?); the page is {page}\n"
    assert asked == [page.as_uri()]
