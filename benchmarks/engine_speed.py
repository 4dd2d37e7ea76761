"""How fast the engine simulates, whole process and in the engine, and its peak memory.

Workloads: (a) the chapter's, 2,000-token prompts and 300-token outputs, chunked prefill, closed
loop of 64 clients; (b) open loop at 12 req/s with the same lengths, for static, continuous,
chunked and priority (3 levels); (c) the Azure conversation trace, tiled end to end when more
requests are asked for than it holds. Each case runs in a fresh process: `wall s` is that whole
process (start-up and imports included), `engine s` the simulation and its summary (every metric,
ITL included) inside it, `peak MB` its peak RSS. `--tokens` also writes the tokens table (a run
folder's largest file) and times that.

`--baseline REV` runs the same cases, in the same benchmark run, on servesim as it was at git
revision REV (checked out into a temporary worktree; default: the last commit before the one-engine
redesign, whose default engine was `simulator/fast.py`), alternating with this checkout's runs
(`--repeat`, 3 by default), and prints the medians and the ratio of the median wall times.
`a-copied-chunked-c64` runs a fresh copy of `policies/chunked.py` registered under another name
(the baseline runs its built-in chunked policy there).

Run: python -m benchmarks.engine_speed [--sizes 10000,100000,1000000] [--baseline REV | --no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT.parent / "shared" / "reference" / "traces" / "azure_conv_2023.csv"
BASELINE = "11acbd2"
"""main before the one-engine redesign (its fast engine ran outside SimPy)."""
CASES: dict[str, dict[str, object]] = {
    "a-chunked-c64": dict(policy="chunked", concurrency=64),
    "a-copied-chunked-c64": dict(policy="copied-chunked", concurrency=64),
    "b-static-r12": dict(policy="static", rate=12.0),
    "b-continuous-r12": dict(policy="continuous", rate=12.0),
    "b-chunked-r12": dict(policy="chunked", rate=12.0),
    "b-priority-r12": dict(policy="priority", rate=12.0, priority_levels=3),
    "c-azure-chunked": dict(policy="chunked", trace=str(AZURE)),
}


def tiled_trace(n: int):  # type: ignore[no-untyped-def]
    """The Azure trace repeated back to back (each copy starts one mean gap after the last) up to n."""
    from workloads import Workload, read_trace

    trace = read_trace(AZURE)
    assert trace.arrival is not None
    copies = -(-n // trace.num_requests)
    span = float(trace.arrival[-1]) + float(np.mean(np.diff(trace.arrival)))
    arrival = np.concatenate([trace.arrival + i * span for i in range(copies)])[:n]
    return Workload(prompt_tokens=np.tile(trace.prompt_tokens, copies)[:n],
                    output_tokens=np.tile(trace.output_tokens, copies)[:n], arrival=arrival, concurrency=None)


def run_one(case: str, n: int, tokens_dir: str | None = None) -> dict[str, float | str | int]:
    """One case in this process: the simulation, its summary and, with `tokens_dir`, its tokens table."""
    from simulator.config import RunConfig
    from simulator.metrics import build_tables, summarize
    from simulator.simulate import simulate

    settings = dict(CASES[case])
    if settings["policy"] == "copied-chunked":
        register_copy("chunked", "copied-chunked")
    workload = None
    if "trace" in settings:
        workload = tiled_trace(n)
        settings.pop("trace")
    start = time.perf_counter()
    result = simulate(RunConfig(num_requests=n, **settings), workload)  # type: ignore[arg-type]
    summary = summarize(result, build_tables(result, tokens=False))
    engine = time.perf_counter() - start
    row: dict[str, float | str | int] = {"case": case, "requests": n, "engine_s": engine,
                                         "simulated_s": summary["duration"], "steps": summary["num_steps"]}
    if tokens_dir is not None:
        from simulator.tokens import TokensTable

        TokensTable(result.log).write(Path(tokens_dir) / "tokens.parquet", {})
        row["tokens_s"] = time.perf_counter() - start - engine
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def register_copy(module: str, name: str) -> None:
    """A fresh copy of a built-in policy's module, imported from its file and registered under `name`
    (the engine must run it exactly as fast as the original)."""
    import importlib.util

    import policies

    spec = importlib.util.spec_from_file_location(f"copied_{module}", ROOT / "policies" / f"{module}.py")
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = copy
    spec.loader.exec_module(copy)
    policies.POLICIES[name] = copy.build


def measure(tree: Path, case: str, n: int, tokens: bool, baseline: bool) -> dict[str, Any]:
    """Run one case in a fresh process of the servesim in `tree`; `wall_s` is the whole process."""
    if baseline:  # the old benchmark's own entry point: CASE N ENGINE
        command = ["--one", case, str(n), "fast"]
    else:
        command = ["--one", case, str(n)] + (["--tokens-dir", tempfile.mkdtemp()] if tokens else [])
    env = os.environ | {"PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.engine_speed", *command], cwd=tree, env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    row: dict[str, Any] = json.loads(done.stdout)
    row["wall_s"] = wall
    row.setdefault("engine_s", row.get("wall_s", wall))
    return row


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median whole-process wall time (its other figures with it)."""
    return sorted(runs, key=lambda r: float(r["wall_s"]))[len(runs) // 2]


def baseline_tree(rev: str) -> Path:
    # Beside this checkout, so that its benchmark finds ../shared as this one does.
    path = Path(tempfile.mkdtemp(prefix=".servesim-baseline-", dir=ROOT.parent))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT, check=True,
                   capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="request counts, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES), help="which workloads, comma-separated")
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare against")
    parser.add_argument("--no-baseline", action="store_true", help="measure this checkout only")
    parser.add_argument("--tokens", action="store_true", help="also write the tokens table, and time it")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each case, alternating with the baseline's; medians are printed")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--tokens-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.tokens_dir)))
        return
    old = None if args.no_baseline else baseline_tree(args.baseline)
    try:
        print(f"{'case':<20}{'requests':>9}{'wall s':>9}{'engine s':>10}{'tokens s':>10}{'steps':>10}"
              f"{'peak MB':>9}{'baseline wall s':>17}{'MB':>7}{'wall / baseline':>17}")
        for n in (int(s) for s in args.sizes.split(",")):
            for case in args.cases.split(","):
                baseline_case = case.replace("copied-", "")
                compare = old is not None and f'"{baseline_case}"' in old_cases(old)
                news, refs = [], []
                for _ in range(args.repeat):  # alternating, so both see the same machine
                    news.append(measure(ROOT, case, n, args.tokens, baseline=False))
                    if compare:
                        assert old is not None
                        refs.append(measure(old, baseline_case, n, False, baseline=True))
                new = median_run(news)
                line = (f"{case:<20}{n:>9}{new['wall_s']:>9.2f}{new['engine_s']:>10.2f}"
                        f"{new.get('tokens_s', float('nan')):>10.2f}{new['steps']:>10}{new['peak_rss_mb']:>9.0f}")
                if refs:
                    ref = median_run(refs)
                    line += f"{ref['wall_s']:>17.2f}{ref['peak_rss_mb']:>7.0f}{new['wall_s'] / ref['wall_s']:>17.2f}"
                print(line, flush=True)
    finally:
        if old is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
            shutil.rmtree(old, ignore_errors=True)


def old_cases(tree: Path) -> str:
    """The baseline knows the cases its benchmark names (no priority policy before the redesign);
    the copied policy is compared with the baseline's built-in one."""
    return (tree / "benchmarks" / "engine_speed.py").read_text()


if __name__ == "__main__":
    main()
