"""Coverage and error of `simulate compare` on the new models' rows of aiconfigurator's table.

Reruns the aggregated rows of DeepSeek-R1/V3, Kimi-K2.5, gpt-oss-120b and MiniMax-M2.5 and the
disaggregated DeepSeek rows of the reference table (`../shared/reference/serving/
aiconfigurator_silicon_h100_h200.csv`), as `simulate compare` does, and prints per model, stack and
mode: rows, rows rerun, the median |error| of mean TPOT and mean TTFT, and every skip's reason. The
disaggregated rows whose workers the table does not give (rerun as one prefill and one decode worker,
`simulator.sim2real.silicon`; unless a row of the same measurement gives them) are reported apart, as
`disagg-1p1d`. Each row reruns on the scheduler
`simulate compare` gives a silicon row of its stack by default (`--client supported`:
`simulator.sim2real.sweeps.SUPPORTED`), or on `--scheduler`'s hypothesis for every stack (`stock`,
`bench`, `vllm-default`: `simulator.sim2real.sweeps.Hypothesis`). `--speculative METHOD:K:ACCEPTANCE`
reruns the rows twice, without and with every server speculating so (`mtp:1:0.85`: DeepSeek's MTP
layer drafting one token accepted with probability 0.85), and prints both tables.

    python -m benchmarks.compare_models [--models deepseek-r1,deepseek-v3] [--modes agg] [--scheduler bench]
        [--speculative mtp:1:0.85] [--jobs 2] [--out rows.parquet]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

import polars as pl

from simulator.deploy.resolve import ModelResolver
from simulator.sim2real.compare import ROW_SCHEMA, Scheduler
from simulator.sim2real.silicon import read_silicon_csv, with_twins
from simulator.sim2real.sweeps import SCHEDULERS, SUPPORTED, Hypothesis
from simulator.sim2real.units import run_units, units_of

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
TABLE = REFERENCE / "serving" / "aiconfigurator_silicon_h100_h200.csv"
NEW_MODELS = {"deepseek-ai/DeepSeek-R1": "deepseek-r1", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
              "moonshotai/Kimi-K2.5": "kimi-k2.5", "openai/gpt-oss-120b": "gpt-oss-120b",
              "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5"}
"""The table's hub ids of the new models, with the names the report uses."""
MODES = ("agg", "disagg")
"""The table's modes."""
Key = tuple[str, str, str]
"""A row's (model, stack, mode)."""


def selected_rows(table: Path, models: frozenset[str] = frozenset(NEW_MODELS.values()),
                  modes: frozenset[str] = frozenset(MODES)) -> tuple[dict[str, Key], dict[str, Key]]:
    """The selected rows' (model, stack, mode), by row id (a point's name) and by place (a skip's):
    the aggregated rows of `models` (report names) and DeepSeek's disaggregated ones (mode
    `disagg-1p1d` where the table does not give the workers), of the table's `modes`."""
    by_id, by_place = {}, {}
    with table.open(newline="") as handle:
        reader = csv.DictReader(handle)
        placed = [(f"{table.name} line {reader.line_num}", row) for row in reader]
    for place, row in with_twins(placed):  # a row that takes its twin's workers is not rerun 1p1d
        model = NEW_MODELS.get(row["model_path"].strip())
        if model not in models or (row["mode"] == "disagg" and not model.startswith("deepseek")) \
                or row["mode"] not in modes:
            continue
        mode = row["mode"]
        if mode == "disagg" and not row["prefill_num_workers"].strip():
            mode = "disagg-1p1d"
        by_id[row["id"]] = by_place[place] = (model, row["backend"], mode)
    return by_id, by_place


def model_names(text: str) -> frozenset[str]:
    """`--models`: report names, comma-separated; an unknown one is refused, naming it."""
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(NEW_MODELS.values()))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown model {', '.join(unknown) or repr(text)}; choose from {', '.join(sorted(NEW_MODELS.values()))}")
    return names


def mode_names(text: str) -> frozenset[str]:
    """`--modes`: the table's modes, comma-separated; an unknown one is refused, naming it."""
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if not names or not names <= set(MODES):
        raise argparse.ArgumentTypeError(f"unknown mode {text!r}; choose from {', '.join(MODES)}")
    return names


def speculation(text: str) -> tuple[str, int, str]:
    """`--speculative METHOD:K:ACCEPTANCE` (`mtp:1:0.85`); what `RunConfig` refuses of it, each row's
    rerun refuses alike."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"--speculative takes METHOD:K:ACCEPTANCE (as mtp:1:0.85), got {text!r}")
    return parts[0], int(parts[1]), parts[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--models", type=model_names, default=frozenset(NEW_MODELS.values()),
                        help="only these models' rows (comma-separated report names)")
    parser.add_argument("--modes", type=mode_names, default=frozenset(MODES),
                        help="only rows of these modes (comma-separated: agg, disagg)")
    parser.add_argument("--configs", type=Path, default=REFERENCE / "models",
                        help="the folder of the models' config.json files")
    parser.add_argument("--scheduler", choices=("supported", *SCHEDULERS), default="supported",
                        help="the servers' scheduler: each stack's supported one, or this one for every stack")
    parser.add_argument("--speculative", type=speculation, default=None,
                        help="also rerun every row with this speculative decoding, METHOD:K:ACCEPTANCE")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the compare rows here (Parquet)")
    args = parser.parse_args()
    by_id, by_place = selected_rows(args.table, args.models, args.modes)
    reading = read_silicon_csv(args.table, ModelResolver(args.configs, args.configs / ".no-hf-cache"))
    points = [p for p in reading.points if p.name in by_id]
    read_skips = [(by_place[where], reason) for where, reason in reading.skipped if where in by_place]
    rules = [SUPPORTED.get(point.backend) if args.scheduler == "supported" else Hypothesis(args.scheduler)
             for point in points]
    frames = []
    for spec in (None, args.speculative) if args.speculative else (None,):
        rows: list[dict[str, object]] = []
        skipped = list(read_skips)
        for result in run_units(units_of(points), {}, scheduler=Scheduler(speculation=spec), jobs=args.jobs,
                                rules=rules):
            rows += result.rows
            skipped += [(by_id[name], reason) for name, reason in result.skipped]
        frame = pl.DataFrame(rows, schema=ROW_SCHEMA)
        frames.append(frame.with_columns(speculative=pl.lit(":".join(map(str, spec)) if spec else "")))
        if args.speculative:
            print(f"\n{'with --speculative ' + ':'.join(map(str, spec)) if spec else 'without speculation'}:")
        report(frame, by_id, skipped)
    if args.out is not None:
        pl.concat(frames).write_parquet(args.out)


def report(frame: pl.DataFrame, keys: dict[str, Key], skipped: list[tuple[Key, str]]) -> None:
    """The per-(model, stack, mode) table, the aggregated rows' coverage and the skip reasons."""
    totals = Counter(keys.values())
    errors = frame.with_columns(key=pl.col("point").replace_strict(
        {name: " ".join(key) for name, key in keys.items()}, default=""), abs_error=pl.col("error").abs())
    print(f"{'model':<14}{'stack':<8}{'mode':<13}{'rows':>6}{'rerun':>7}{'|err| TPOT':>12}{'|err| TTFT':>12}")
    covered = agg = 0
    for key in sorted(totals):
        mine = errors.filter(pl.col("key") == " ".join(key))
        rerun = mine.select("point").n_unique()
        medians = [mine.filter(pl.col("statistic") == s)["abs_error"].median() for s in ("tpot_mean", "ttft_mean")]
        shown = [f"{m:.1%}" if isinstance(m, float) else "-" for m in medians]
        print(f"{key[0]:<14}{key[1]:<8}{key[2]:<13}{totals[key]:>6}{rerun:>7}{shown[0]:>12}{shown[1]:>12}")
        if key[2] == "agg":
            covered, agg = covered + rerun, agg + totals[key]
    print(f"\naggregated rows rerun: {covered} of {agg} ({covered / max(agg, 1):.1%})")
    reasons = Counter((key[0], key[2], reason[:120]) for key, reason in skipped)
    if reasons:
        print("skipped:")
        for (model, mode, reason), count in sorted(reasons.items()):
            print(f"  {count:>4}  {model} {mode}: {reason}")


if __name__ == "__main__":
    main()
