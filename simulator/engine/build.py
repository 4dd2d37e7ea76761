"""Which build of the engine this process runs: compiled with mypyc or pure Python (setup.py).

The compiled build installs each compiled module as an extension beside its source, which Python
imports first; the line below says which one the server's module came from. Everything setup.py
compiles (the engine, the roofline cost model and the step shape, the clients, the policies) is
compiled together or not at all (one shared library), so one module tells for all.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES

from simulator.engine import server


def is_compiled() -> bool:
    """Was the engine imported from the compiled build?"""
    return (server.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


def build_line() -> str:
    """One line naming the build in use (`simulate --version`, summary.json's provenance)."""
    if is_compiled():
        return "compiled (mypyc): simulator.engine, the roofline, the clients and policies"
    return "pure Python"
