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
(`--repeat`, 3 by default), and prints the medians and the ratio of wall times: the median, over
the repeats, of each run's ratio to the baseline run beside it (each pair ran back to back, so a
machine that slows down for a while slows both), with the lowest and highest of those ratios, and
the same median for CPU time (user + system; a process waiting for a core counts in its wall time
only).
`a-copied-chunked-c64` runs a fresh copy of `policies/chunked.py` registered under another name
(the baseline runs its built-in chunked policy there).

`--vidur` runs the command line of the speed issue's case as a user would, one whole `simulate`
process each (`simulate --policy chunked --rate 12 --input-len 2000 --output-len 300 --no-tokens
--num-prompts N`, and with the tokens table on), and prints it beside Vidur's figures for the same
workload. Those were measured elsewhere, not by this script: on the same kind of 2-core machine,
whole process, median of 3 alternating runs, microsoft/vidur with the sarathi scheduler (8,192-token
chunks), Llama-3-8B on H100, Poisson 12 req/s, fixed 2,000/300 tokens, metrics off (`VIDUR`).
With a baseline (`--baseline REV`; `--no-baseline` for none) the same command runs on the
baseline's checkout (pure Python) in turn, and the table adds the paired wall and CPU ratios, as
the cases' table does: `--vidur --baseline 344f63f` is the speed issue's own measure, the whole
process against the commit it started from.

Each case runs on both builds of this checkout side by side (setup.py): `pure`, the checkout's
modules, and `compiled`, the installed servesim when `pip install .` compiled it (its sources must be
the checkout's; a process outside the checkout imports it). Without a compiled install only the pure
build is measured, and the table says why. `compiled / pure` and `/ baseline` are medians of
ratios of runs made back to back.

`--instructions` counts the instructions per request of each case, here and on the baseline, under
valgrind's callgrind: two whole processes of `INSTRUCTION_SIZES` requests each, their difference
divided by the difference in requests. Unlike wall time on a shared machine, it does not move from
run to run; it does not see what a cache miss or a mispredicted branch costs.

Run: python -m benchmarks.engine_speed [--sizes 10000,100000,1000000] [--baseline REV | --no-baseline]
     python -m benchmarks.engine_speed --instructions [--cases b-static-r12,b-chunked-r12]
     python -m benchmarks.engine_speed --vidur [--sizes 10000,100000] [--repeat 3] [--baseline REV | --no-baseline]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
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
VIDUR: dict[tuple[int, bool], tuple[float, str]] = {
    (10_000, False): (17.0, "17.0-18.2 s, random-forest predictor (the faster end)"),
    (100_000, False): (95.5, "95.5 s random forest, 115.5 s linear regression"),
    (100_000, True): (205.0, "205-209 s, default metrics and chrome trace, 1.8 GB"),
}
"""Vidur's whole-process wall time (seconds) by (requests, outputs on), as the speed issue measured it."""
VIDUR_CASE = ["--policy", "chunked", "--rate", "12", "--input-len", "2000", "--output-len", "300"]
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
    from simulator.metrics.summary import build_tables, summarize
    from simulator.run.simulate import simulate

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
        from simulator.metrics.tokens import TokensTable

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
    policies.POLICIES[name] = copy


def one_case(case: str, n: int, tree: Path) -> list[str]:
    """The arguments of `tree`'s benchmark for one case in its own process: CASE N, or CASE N ENGINE
    in a servesim from before the one-engine redesign (which had `simulator/fast.py`)."""
    return ["--one", case, str(n), *(["fast"] if (tree / "simulator" / "fast.py").exists() else [])]


def baseline_case(case: str, old: Path | None) -> str | None:
    """The case the baseline runs beside `case` (its built-in policy for the copied one), or None
    when there is no baseline or it lacks the case."""
    name = case.replace("copied-", "")
    return name if old is not None and f'"{name}"' in old_cases(old) else None


def launcher(tree: Path, build: str) -> tuple[list[str], Path, dict[str, str]]:
    """How to start this benchmark in a fresh process of `build` ("pure": the modules of `tree`;
    "compiled": the installed servesim, from outside the checkout): command, working directory,
    environment."""
    if build == "compiled":
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return [sys.executable, str(ROOT / "benchmarks" / "engine_speed.py")], Path(tempfile.gettempdir()), env
    return [sys.executable, "-m", "benchmarks.engine_speed"], tree, os.environ | {"PYTHONPATH": str(tree)}


def compiled_build() -> str | None:
    """Why the compiled build cannot be measured (None when it can): the installed servesim must be
    compiled, and its engine and policy sources the checkout's."""
    _, cwd, env = launcher(ROOT, "compiled")
    probe = ("import simulator, policies; from simulator.engine.build import build_line; "
             "print(build_line()); print(simulator.__file__); print(policies.__file__)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        return "servesim is not installed"
    line, simulator_init, policies_init = done.stdout.splitlines()
    if "compiled" not in line:
        return f"the installed servesim is {line} (pip install . with a C compiler compiles it)"
    installed = {"simulator/engine": Path(simulator_init).parent / "engine", "policies": Path(policies_init).parent}
    for folder, copy in installed.items():
        for source in (ROOT / folder).glob("*.py"):
            if not (copy / source.name).is_file() or (copy / source.name).read_bytes() != source.read_bytes():
                return f"the installed {folder}/{source.name} is not the checkout's (pip install . again)"
    return None


def measure(tree: Path, case: str, n: int, tokens: bool, build: str = "pure") -> dict[str, Any]:
    """Run one case in a fresh process of the servesim in `tree` (`build`: `launcher`); `wall_s` is
    the whole process, `cpu_s` its user and system CPU time."""
    command = one_case(case, n, tree) + (["--tokens-dir", tempfile.mkdtemp()] if tokens else [])
    start_command, cwd, env = launcher(tree, build)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([*start_command, *command], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row: dict[str, Any] = json.loads(done.stdout)
    row["wall_s"] = wall
    row["cpu_s"] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
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
    parser.add_argument("--vidur", action="store_true",
                        help="the speed issue's case as whole `simulate` processes, against Vidur's figures")
    parser.add_argument("--instructions", action="store_true",
                        help="instructions per request under valgrind's callgrind, beside the baseline's")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--tokens-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.tokens_dir)))
        return
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions counts under valgrind's callgrind, and valgrind is not on PATH")
    old = None if args.no_baseline else baseline_tree(args.baseline)
    try:
        if args.vidur:
            vidur_table([int(s) for s in args.sizes.split(",")], args.repeat, builds(), old)
            return
        if args.instructions:
            instructions_table(args.cases.split(","), old, builds())
            return
        speed_table([int(s) for s in args.sizes.split(",")], args.cases.split(","), old, args.repeat, args.tokens,
                    builds())
    finally:
        if old is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
            shutil.rmtree(old, ignore_errors=True)


def builds() -> list[str]:
    """The builds to measure: pure, and compiled when it can be (saying why not when it cannot)."""
    why_not = compiled_build()
    if why_not is not None:
        print(f"compiled build not measured: {why_not}", flush=True)
    return ["pure"] if why_not else ["pure", "compiled"]


def paired(news: list[dict[str, Any]], refs: list[dict[str, Any]]) -> tuple[float, float, float, float]:
    """Median wall and CPU ratios of runs made back to back, and the lowest and highest wall ratio."""
    walls = sorted(a["wall_s"] / b["wall_s"] for a, b in zip(news, refs, strict=True))
    cpu = float(np.median([a["cpu_s"] / b["cpu_s"] for a, b in zip(news, refs, strict=True)]))
    return float(np.median(walls)), cpu, walls[0], walls[-1]


def writes_tokens(tree: Path) -> bool:
    """Whether the engine_speed of the checkout `tree` can write the tokens table (`--tokens-dir`)."""
    script = tree / "benchmarks" / "engine_speed.py"
    return script.is_file() and "--tokens-dir" in script.read_text()


def speed_table(sizes: list[int], cases: list[str], old: Path | None, repeat: int, tokens: bool,
                measured: list[str]) -> None:
    """Each case on each build and on the baseline, `repeat` times in turn; medians, and ratios of
    runs made back to back. With `tokens`, the baseline writes the tokens table too where its own
    benchmark can; where it cannot, the ratios compare runs with the table to runs without, and a
    line says so."""
    baseline_tokens = tokens and old is not None and writes_tokens(old)
    if tokens and old is not None and not baseline_tokens:
        print("the baseline's benchmark cannot write the tokens table: its runs are without it, and the ratios to "
              "it compare unlike runs")
    print(f"{'case':<21}{'requests':>9}{'build':>9}{'wall s':>8}{'cpu s':>7}{'engine s':>9}{'tokens s':>9}"
          f"{'steps':>9}{'peak MB':>8}{'baseline wall s':>16}{'cpu s':>7}{'wall / baseline':>16}{'pairs':>11}"
          f"{'cpu / baseline':>15}{'wall / pure':>12}{'cpu / pure':>11}")
    for n in sizes:
        for case in cases:
            reference = baseline_case(case, old)
            runs: dict[str, list[dict[str, Any]]] = {build: [] for build in [*measured, "baseline"]}
            for _ in range(repeat):  # in turn, so that all see the same machine
                for build in measured:
                    runs[build].append(measure(ROOT, case, n, tokens, build))
                if reference is not None:
                    assert old is not None
                    runs["baseline"].append(measure(old, reference, n, baseline_tokens))
            for build in measured:
                new = median_run(runs[build])
                line = (f"{case:<21}{n:>9}{build:>9}{new['wall_s']:>8.2f}{new['cpu_s']:>7.2f}{new['engine_s']:>9.2f}"
                        f"{new.get('tokens_s', float('nan')):>9.2f}{new['steps']:>9}{new['peak_rss_mb']:>8.0f}")
                if runs["baseline"]:
                    ref = median_run(runs["baseline"])
                    wall, cpu, low, high = paired(runs[build], runs["baseline"])
                    pairs = f"{low:.2f}-{high:.2f}"
                    line += f"{ref['wall_s']:>16.2f}{ref['cpu_s']:>7.2f}{wall:>16.2f}{pairs:>11}{cpu:>15.2f}"
                else:
                    line += f"{'-':>16}{'-':>7}{'-':>16}{'-':>11}{'-':>15}"
                if build != "pure":
                    wall, cpu, _, _ = paired(runs[build], runs["pure"])
                    line += f"{wall:>12.2f}{cpu:>11.2f}"
                print(line, flush=True)


INSTRUCTION_SIZES = (2_000, 6_000)
"""Two runs per case: the difference of their counts is the engine's and its summary's, start-up cancels."""


def instructions(tree: Path, case: str, n: int, build: str = "pure") -> int:
    """Instructions one whole `--one` process of `build` executes under callgrind (BLAS on one
    thread, whose idle threads would otherwise spin and count; a fixed hash seed)."""
    start, cwd, env = launcher(tree, build)
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *start, *one_case(case, n, tree)]
    env = env | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    counted = re.search(r"Collected : (\d+)", done.stderr)
    assert counted is not None, done.stderr[-2000:]
    return int(counted.group(1))


def instructions_table(cases: list[str], old: Path | None, measured: list[str]) -> None:
    """Instructions per request on each build and the baseline, a figure the machine's load does not
    move (unlike wall time)."""
    def per_request(tree: Path, case: str, build: str = "pure") -> float:
        low, high = INSTRUCTION_SIZES
        return (instructions(tree, case, high, build) - instructions(tree, case, low, build)) / (high - low)

    print(f"{'case':<21}{'pure':>10}{'compiled':>10}{'compiled / pure':>17}{'baseline':>10}{'pure / baseline':>17}"
          f"{'compiled / baseline':>21}  (instructions per request)")
    for case in cases:
        counts = {build: per_request(ROOT, case, build) for build in measured}
        compiled = counts.get("compiled", math.nan)
        line = f"{case:<21}{counts['pure']:>10,.0f}{compiled:>10,.0f}{compiled / counts['pure']:>17.2f}"
        reference = baseline_case(case, old)
        if reference is not None:
            assert old is not None
            ref = per_request(old, reference)
            line += f"{ref:>10,.0f}{counts['pure'] / ref:>17.2f}{compiled / ref:>21.2f}"
        print(line, flush=True)


def cli_run(n: int, tokens: bool, build: str = "pure", tree: Path = ROOT) -> dict[str, float]:
    """Whole-process wall and CPU seconds and peak RSS (MB) of one `simulate` run of the Vidur case
    on `build` of `tree` (the command line's entry point, in a directory that picks the build:
    `launcher`)."""
    with tempfile.TemporaryDirectory() as out:
        _, cwd, env = launcher(tree, build)
        command = [sys.executable, "-c", "from simulator.cli.main import run; run()", *VIDUR_CASE, "--num-prompts",
                   str(n), "--tokens" if tokens else "--no-tokens", "--out", str(Path(out) / "run")]
        with open(Path(out) / "output", "wb") as output:
            start = time.perf_counter()
            child = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)  # this child's own usage (peak memory included)
            wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, command, (Path(out) / "output").read_bytes())
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def vidur_table(sizes: list[int], repeat: int, measured: list[str], old: Path | None = None) -> None:
    """Medians of `repeat` runs of each build (and of the baseline's pure build, from its checkout),
    in turn; `s / 100k` shows how the wall time scales with the request count; `/ baseline` are
    medians of the ratios of runs made back to back."""
    print(f"{'requests':>9}{'tokens':>8}{'build':>10}{'servesim wall s':>17}{'cpu s':>7}{'s / 100k':>10}{'peak MB':>9}"
          f"{'Vidur wall s':>14}{'Vidur / servesim':>18}"
          + (f"{'baseline wall s':>17}{'cpu s':>7}{'wall / baseline':>17}{'pairs':>11}{'cpu / baseline':>16}"
             if old is not None else "") + "  Vidur, as measured elsewhere")
    for n in sizes:
        for tokens in (False, True):
            if tokens and (n, True) not in VIDUR:
                continue
            runs: dict[str, list[dict[str, float]]] = {build: [] for build in [*measured, "baseline"]}
            for _ in range(repeat):
                for build in measured:
                    runs[build].append(cli_run(n, tokens, build))
                if old is not None:
                    runs["baseline"].append(cli_run(n, tokens, "pure", old))
            for build in measured:
                wall = float(np.median([run["wall_s"] for run in runs[build]]))
                cpu = float(np.median([run["cpu_s"] for run in runs[build]]))
                peak = float(np.median([run["peak_mb"] for run in runs[build]]))
                vidur = VIDUR.get((n, tokens))
                line = (f"{n:>9}{'on' if tokens else 'off':>8}{build:>10}{wall:>17.2f}{cpu:>7.2f}"
                        f"{wall * 100_000 / n:>10.2f}{peak:>9.0f}")
                line += f"{vidur[0]:>14.1f}{vidur[0] / wall:>18.1f}" if vidur else f"{'-':>14}{'-':>18}"
                if old is not None:
                    base = runs["baseline"]
                    ratio, cpu_ratio, low, high = paired(runs[build], base)
                    base_wall, base_cpu = (float(np.median([b[key] for b in base])) for key in ("wall_s", "cpu_s"))
                    pairs = f"{low:.2f}-{high:.2f}"
                    line += f"{base_wall:>17.2f}{base_cpu:>7.2f}{ratio:>17.2f}{pairs:>11}{cpu_ratio:>16.2f}"
                print(line + f"  {vidur[1] if vidur else 'not measured'}", flush=True)


def old_cases(tree: Path) -> str:
    """The baseline knows the cases its benchmark names (no priority policy before the redesign);
    the copied policy is compared with the baseline's built-in one."""
    return (tree / "benchmarks" / "engine_speed.py").read_text()


if __name__ == "__main__":
    main()
