"""The `simulate` command line: one run by default, the chapter's batch table, sweeps, reports and calibration.

Each verb lives in its own module and is imported only when it runs or shows its help, so a run
loads no plotting, calibration or sweep code, and `simulate --help` loads none of them.
Bad input ends with one line naming the bad value and exit status 2, a fault of the file system
with one line and exit status 1, never a traceback.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click_default_group import DefaultCommandFormatter, DefaultGroup

from simulator.errors import InputError, clip, clip_path

VERBS = {
    "run": "simulator.cli.run_command:run_command",
    "batch-table": "simulator.cli.batch_table_command:batch_table_command",
    "sweep": "simulator.cli.sweep_command:sweep_command",
    "plan": "simulator.cli.plan_command:plan_command",
    "calibrate": "calibration.measure:calibrate_command",
    "validate": "calibration.validate:validate_command",
    "report": "simulator.cli.report_command:report_command",
    "compare": "simulator.cli.compare_command:compare_command",
    "fit": "calibration.fit_host:fit_command",
}
"""Each verb's command, as "module:attribute"."""


def docstring(target: str) -> str:
    """The docstring of the function at "module:function", read from its source without importing the module."""
    import ast  # here: only the command list needs it, and a run is faster without its import

    module, function = target.split(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_docstring(node) or ""
    raise LookupError(f"no function {function} in {spec.origin}")


def import_settled(module: str) -> Any:
    """Import a verb's module with the cycle collector paused, then freeze what the process holds
    so far (`gc.freeze`) when the import was the first: numpy, polars, pyarrow and the simulator
    leave objects that live as long as the process, which every later full collection would walk
    again for nothing (one during pyarrow's import of ssl, another when a run's tables are
    built). Imports make no cyclic garbage worth collecting."""
    if module in sys.modules:
        return sys.modules[module]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


class LazyGroup(DefaultGroup):
    """A default group whose commands are imported on first use; its help lists them from their docstrings."""

    def __init__(self, *args: Any, verbs: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verbs = verbs

    def load(self, name: str) -> click.Command:
        if name not in self.commands:
            module, attribute = self.verbs[name].split(":")
            self.add_command(getattr(import_settled(module), attribute), name)
        return self.commands[name]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.verbs)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        # An option that names no verb is the default verb's (DefaultGroup's rule: `simulate --rate 12`);
        # a word is a verb mistyped, as the default verb takes options only.
        if cmd_name not in self.verbs and not cmd_name.startswith("-"):
            import difflib  # only for a mistyped verb

            close = difflib.get_close_matches(cmd_name, self.verbs, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the commands are {', '.join(sorted(self.verbs))}"
            raise click.UsageError(f"no such command {clip(repr(cmd_name))} ({hint})", ctx)
        self.load(cmd_name if cmd_name in self.verbs else self.default_cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, with each short help from the verb's docstring rather than from its imported command."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, click.Command(name, help=docstring(self.verbs[name])).get_short_help_str(limit))
                for name in names]
        with formatter.section("Commands"):
            DefaultCommandFormatter(self, formatter, mark="*").write_dl(rows)


def print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """`--version`: servesim's version and which build of the engine runs (simulator.engine.build)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    from simulator.engine.build import build_line  # imports the engine: only when asked

    try:
        installed = version("servesim")
    except PackageNotFoundError:
        installed = "(not installed)"
    click.echo(f"servesim {installed}, engine: {build_line()}")
    ctx.exit()


@click.group(cls=LazyGroup, verbs=VERBS, default="run", default_if_no_args=True)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=print_version,
              help="Print the version and which build of the engine runs (compiled or pure Python), then exit.")
def main() -> None:
    """servesim: a discrete-event simulator of LLM inference serving.

    `run` (starred below) is the default command: `simulate --rate 12` is `simulate run --rate 12`,
    and `simulate` alone runs the default configuration. `simulate COMMAND --help` lists a
    command's options with their defaults.
    """


def join_goodput_values(argv: list[str]) -> list[str]:
    """Let `--goodput ttft:500 tpot:50` take several words, as `vllm bench serve` does."""
    joined: list[str] = []
    i = 0
    while i < len(argv):
        joined.append(argv[i])
        i += 1
        if joined[-1] == "--goodput":
            end = i
            while end < len(argv) and not argv[end].startswith("-"):
                end += 1
            if end > i:
                joined.append(" ".join(argv[i:end]))
                i = end
    return joined


def as_typed(message: str, args: list[str]) -> str:
    """Name each flag in `message` as the user typed it: --num-prompts where they wrote that, not --num-requests."""
    for command in main.commands.values():  # the verbs loaded, the one that raised among them
        for option in command.params:
            canonical, *aliases = option.opts
            for alias in aliases:
                if any(arg == alias or arg.startswith(f"{alias}=") for arg in args):
                    message = re.sub(rf"{re.escape(canonical)}(?![\w-])", alias, message)
    return message


def clipped_quotes(message: str) -> str:
    """A click message with each quoted value cut as ours are: click quotes a bad choice whole."""
    return re.sub(r"'[^'\n]*'", lambda quoted: clip(quoted.group()), message)


def os_error_line(exc: OSError) -> str:
    """A file-system fault as one line: what failed, on which file (the last ~80 characters of its path)."""
    files = [clip_path(str(name)) for name in (exc.filename, exc.filename2) if name is not None]
    what = exc.strerror or str(exc) or type(exc).__name__
    return f"{what}: {' -> '.join(files)}" if files else what


def stdout_failed() -> bool:
    """Flush stdout; if it cannot be written (a closed pipe, a full device), point it at /dev/null so
    that the interpreter's last flush does not fail again, and say so."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return True
    return False


def run(argv: list[str] | None = None, exit: Callable[[int], Any] = sys.exit) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit, and so do faults of
    the file system (a full disk, a folder that cannot be read, stdout closed): exit status 1."""
    args = join_goodput_values(sys.argv[1:] if argv is None else argv)
    try:
        main.main(args=args, prog_name="simulate", standalone_mode=False)
        sys.stdout.flush()  # a full device or a closed pipe on stdout shows here, not as the interpreter ends
    except OSError as exc:  # I/O only: anything else that escapes is a bug and keeps its traceback
        where = "cannot write to standard output: " if stdout_failed() else ""
        click.echo(f"error: {where}{os_error_line(exc)}", err=True)
        exit(1)
    except InputError as exc:
        click.echo(f"error: {as_typed(str(exc), args)}", err=True)
        exit(2)
    except click.exceptions.Exit as exc:
        exit(exc.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        exit(1)
    except click.ClickException as exc:
        click.echo(f"error: {clipped_quotes(exc.format_message())}", err=True)
        exit(exc.exit_code)
    else:
        exit(0)
