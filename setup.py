"""The optional compiled build: the engine and the policies compiled with mypyc from their own source.

`pip install .` compiles `COMPILED` when mypy (a build requirement, which brings mypyc) and a C
compiler are there, and installs the pure modules alone otherwise, saying why; it never fails for
want of either. The pure modules stay the source of truth: they are installed beside the compiled
ones, which Python imports first. Pure Python is installed

- with `SERVESIM_PURE=1` set at build time;
- by an editable install (`pip install -e .`), whose modules are the checkout's files as they are.

`simulator.build.BUILD` says which build a process runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "simulator/cost/contract.py",
    "simulator/cost/roofline.py",
    "simulator/engine/blocks.py",
    "simulator/engine/decoders.py",
    "simulator/engine/delivery.py",
    "simulator/engine/kv.py",
    "simulator/engine/loads.py",
    "simulator/engine/offload.py",
    "simulator/engine/queues.py",
    "simulator/engine/request.py",
    "simulator/engine/running.py",
    "simulator/engine/server.py",
    "simulator/engine/speculation.py",
    "simulator/engine/step.py",
    "simulator/engine/steplog.py",
    "simulator/engine/stretch.py",
    "simulator/run/clients.py",
    "policies/chunked.py",
    "policies/continuous.py",
    "policies/inflight.py",
    "policies/prefill_first.py",
    "policies/priority.py",
    "policies/shortest_prompt_first.py",
    "policies/static.py",
]
"""What mypyc compiles (one shared library, and one small extension per module that loads it)."""


def say(line: str) -> None:
    print(f"servesim: {line}", file=sys.stderr, flush=True)


class OptionalBuildExt(build_ext):
    """build_ext that installs pure Python instead when a compiled module cannot be built, and
    builds nothing in place (an editable install)."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False) or self.inplace:
            say("an editable install runs the pure-Python modules (not compiled)")
            return
        try:
            super().run()
        except Exception as error:  # no compiler, a compiler error: the pure modules serve
            say(f"the compiled build failed ({type(error).__name__}: {error}); installing pure Python")
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            self.extensions.clear()

    def get_outputs(self) -> list[str]:
        return super().get_outputs() if self.extensions else []


def ext_modules() -> list:  # type: ignore[type-arg]
    if os.environ.get("SERVESIM_PURE", "") not in ("", "0"):
        say("SERVESIM_PURE is set: installing pure Python")
        return []
    if not {"bdist_wheel", "build", "build_ext", "install"} & set(sys.argv) or "editable_wheel" in sys.argv:
        return []  # metadata, or an editable install: nothing to compile (mypyc type-checks first, which takes a while)
    try:
        from mypyc.build import mypycify
    except ImportError:
        say("mypyc (from mypy) is not installed: installing pure Python")
        return []
    try:
        return mypycify(COMPILED, opt_level="3", debug_level="0")  # type: ignore[no-any-return]
    except (Exception, SystemExit) as error:  # mypy's type errors exit; the pure modules serve
        say(f"mypyc could not compile the engine ({error}); installing pure Python")
        return []


if __name__ == "__main__":  # as setuptools runs it (tests/test_build.py imports it)
    setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
