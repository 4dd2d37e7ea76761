"""The fuzz test's scaffolding (test_fuzz.py): values drawn for each option from the click command
itself, one `simulate` call in-process with warnings as errors, and the properties every call holds."""

from __future__ import annotations

import contextlib
import io
import os
import re
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from simulator.cli.main import main, run

EXAMPLES = int(os.environ.get("SERVESIM_FUZZ_EXAMPLES", "0"))
"""Examples per fuzz test in the long profile; 0 (unset) runs CI's bounded count."""


def fuzz_settings(ci_examples: int) -> settings:
    """CI: `ci_examples`, the same ones every run (derandomized, no example database). The long
    profile (SERVESIM_FUZZ_EXAMPLES=N): N random examples each."""
    return settings(max_examples=EXAMPLES or ci_examples, derandomize=not EXAMPLES, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


class Huge(str):
    """A value of 10^5 characters that shows itself in a line, so a failing example stays readable."""

    def __repr__(self) -> str:
        return f"'{self[:1]}' * {len(self)}"


NUMBER_EDGES = ["0", "-1", "-7", "nan", "inf", "-inf", "1e308", "-1e308", "1e-300", str(2**63), str(2**64),
                str(-(2**63)), "0.5", "1.5", "1e3", "0x10", " 3 ", "1_000", "٣"]
TEXT_EDGES = ["", " ", "\t \n", Huge("x" * 10**5), Huge("9" * 10**5),
              "\u05e9\u05dc\u05d5\u05dd\u202e", "a\u0301\u0302\u0303", "\x01\x1b[2J\x7f",
              "\U0001f4a5", "-", "--", ",", "1,2", "a:b:c", "none", "true", "[1]", "{}", "%s%n", "~"]
"""Strings no option should take on faith: empty, whitespace, huge, right-to-left, combining marks,
control characters (no NUL: argv cannot hold one), and words of the wrong type."""


def small_numbers() -> st.SearchStrategy[str]:
    """Values that may well be valid, kept small so each run is quick."""
    return st.one_of(st.integers(1, 6).map(str), st.floats(0.05, 6.0).map(lambda x: f"{x:.3g}"))


def shaped(option: click.Option) -> st.SearchStrategy[str]:
    """The option's own forms with an edge inside: 'WORD:NUMBER' for each `word:` its help names, and
    its default with one number replaced."""
    forms: list[st.SearchStrategy[str]] = []
    words = sorted(set(re.findall(r"\b([a-z]+):", option.help or "")))
    if words:
        forms.append(st.builds("{}:{}".format, st.sampled_from(words), st.sampled_from(NUMBER_EDGES) | small_numbers()))
    default = option.default if isinstance(option.default, str) else ""
    if re.search(r"\d", default):
        forms.append(st.sampled_from(NUMBER_EDGES).map(lambda edge: re.sub(r"\d+", edge, default, count=1)))
    return st.one_of(forms) if forms else st.nothing()


def values_for(option: click.Option) -> st.SearchStrategy[list[str]]:
    """Words for `option` on a command line, from its type and its edges (a flag: itself)."""
    names = st.sampled_from(option.opts)
    if option.is_flag:
        return names.map(lambda flag: [flag])
    values: st.SearchStrategy[str] = st.sampled_from(NUMBER_EDGES) | st.sampled_from(TEXT_EDGES) | small_numbers()
    if isinstance(option.type, click.Choice):
        values = st.sampled_from([str(choice) for choice in option.type.choices]) | values
    values = values | shaped(option)
    return st.tuples(names, values).map(list)


def options_of(verb: str, held: frozenset[str]) -> list[click.Option]:
    """The options of `verb` as its click command declares them, less those `held` (by first name)."""
    command = main.load(verb)
    return [p for p in command.params if isinstance(p, click.Option) and p.opts[0] not in held]


@st.composite
def command_lines(draw: st.DrawFn, verb: str, held: frozenset[str], at_most: int = 4) -> list[str]:
    """Up to `at_most` options of `verb` with drawn values, several at once."""
    chosen = draw(st.lists(st.sampled_from(options_of(verb, held)), min_size=1, max_size=at_most,
                           unique_by=lambda option: option.opts[0]))
    return [word for option in chosen for word in draw(values_for(option))]


@dataclass(frozen=True)
class Outcome:
    args: list[str]
    code: int
    out: str
    err: str


def simulate(args: list[str]) -> Outcome:
    """`simulate ARGS` in this process, in the current folder, with every warning an error; an
    exception that escapes `run()` fails the test with its traceback."""
    codes: list[int] = []
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("error")
        try:
            run(args, exit=codes.append)
        except BaseException:  # any escape is the finding, reported whole
            raise AssertionError(f"simulate {shown(args)} raised:\n{traceback.format_exc()}") from None
    return Outcome(args, codes[0], out.getvalue(), err.getvalue())


def shown(args: list[str]) -> str:
    """The command line, each word cut to 60 characters, so a failure's report stays readable."""
    return " ".join(repr(arg[:60]) + ("..." if len(arg) > 60 else "") for arg in args)


LONG_NUMBER = re.compile(r"\d{25,}")
NOT_A_NUMBER = re.compile(r"(?<![\w-])nan(?![\w-])", re.IGNORECASE)


def check(outcome: Outcome, echoes: tuple[str, ...] = ()) -> None:
    """Exit 0 with sane output, or a non-zero exit with one line of at most 300 characters starting
    'error:'; never a traceback or a Python warning. `echoes`: values of the input files that the
    output may show as they are (a point's name), besides the arguments."""
    where = f"simulate {shown(outcome.args)}: exit {outcome.code}\nstdout: {outcome.out[-800:]}\n" \
            f"stderr: {outcome.err[-800:]}"
    assert "Traceback" not in outcome.err and "Warning:" not in outcome.err, where
    if outcome.code == 0:
        printed = outcome.out + outcome.err
        for arg in (*outcome.args, *echoes):  # a value echoed back (a file named nan) is no computed nan
            printed = printed.replace(arg, "") if arg else printed
        assert not NOT_A_NUMBER.search(printed) and not LONG_NUMBER.search(printed), where
    else:
        assert outcome.err.endswith("\n") and outcome.err.count("\n") == 1, where
        assert outcome.err.startswith("error:") and len(outcome.err) <= 301, where


def leftovers(folder: Path) -> list[Path]:
    """Files an interrupted or failed write would leave: scratch files and probes of the output helpers."""
    return [path for path in folder.rglob(".*") if path.name.endswith(".partial") or ".servesim-probe-" in path.name]


@contextlib.contextmanager
def in_folder(folder: Path) -> Iterator[Path]:
    with contextlib.chdir(folder):
        yield folder
