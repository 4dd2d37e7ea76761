"""servesim beside aiconfigurator, on the rows of aiconfigurator's own silicon table that both predict.

aiconfigurator (NVIDIA, `pip install aiconfigurator==0.12.0`) predicts a row's TTFT and TPOT from
its own kernel database, and its accuracy gate runs it on this very table: `cli_estimate` with the
row's deployment (tools/accuracy_regression_testing/predict_silicon_sample.py in its repository).
`predict` does the same, falling back to aiconfigurator's default database wherever the row's
stack version is refused (0.12 ships one version per stack and GPU), in a Python that has
aiconfigurator installed (it imports nothing of servesim's), and writes one CSV line per table
row: aiconfigurator's TTFT and TPOT in ms, or why it gave none (a deployment the table measured
more than once is asked for once). `side-by-side` reads that beside a
`simulate compare --out` file of the same table and prints, per stack, the median |error| of mean
TTFT and TPOT of both on the rows both predicted: all of them, and those no servesim profile's
host fit used (`with_fitted`). aiconfigurator is calibrated on this table, so every row is
in its sample.

    python benchmarks/peer_aiconfigurator.py predict [--silicon CSV] > aiconfigurator.csv
    simulate compare CSV --models ../shared/reference/models --quiet --out compare.parquet
    python -m benchmarks.peer_aiconfigurator side-by-side compare.parquet aiconfigurator.csv
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

SERVING = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving"
SILICON = SERVING / "aiconfigurator_silicon_h100_h200.csv"
PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
DISAGG = tuple(f"{side}_{field}" for side in ("prefill", "decode")
               for field in (*PARALLEL, "batch_size", "num_workers"))
PEER_COLUMNS = ("id", "ttft_ms", "tpot_ms", "database", "reason")


def estimate_args(row: dict[str, str]) -> dict[str, Any]:
    """`cli_estimate`'s keywords for one table row, as aiconfigurator's accuracy gate builds them:
    the aggregated row's batch size and parallelism, or the disaggregated row's per-worker ones;
    an empty cell is left to aiconfigurator's default."""
    fields = ("batch_size", *PARALLEL) if row["mode"] == "agg" else DISAGG
    return {"model_path": row["model_path"], "system_name": row["system"], "mode": row["mode"],
            "backend_name": row["backend"], "backend_version": row["backend_version"] or None,
            "isl": int(row["isl"]), "osl": int(row["osl"]), "gemm_quant_mode": row["gemm_quant_mode"] or None,
            "moe_quant_mode": row["moe_quant_mode"] or None,
            **{field: int(float(row[field])) for field in fields if row.get(field)}}


def predict(silicon: Path) -> None:
    """Write aiconfigurator's prediction of every row of `silicon` to standard output as CSV."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from aiconfigurator.cli.api import cli_estimate  # aiconfigurator's Python, not servesim's

    writer = csv.DictWriter(sys.stdout, fieldnames=PEER_COLUMNS)
    writer.writeheader()
    done: dict[tuple[tuple[str, Any], ...], dict[str, str]] = {}  # the table measures many deployments twice
    with silicon.open(newline="") as f:
        for row in csv.DictReader(f):
            args = estimate_args(row)
            key = tuple(sorted(args.items()))
            if key not in done:
                done[key] = estimate(cli_estimate, args)
            writer.writerow({"id": row["id"], **done[key]})


def estimate(cli_estimate: Any, args: dict[str, Any]) -> dict[str, str]:
    """aiconfigurator's TTFT and TPOT (ms) for one deployment, from the row's database or else its
    default one, or the reason it gave none."""
    line = {"ttft_ms": "", "tpot_ms": "", "database": "", "reason": ""}
    for version in dict.fromkeys((args["backend_version"], None)):  # the row's database, then the default
        try:
            with contextlib.redirect_stdout(sys.stderr):
                result = cli_estimate(**{**args, "backend_version": version})
        except Exception as error:  # any refusal is the row's reason
            line["reason"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            continue
        return {"ttft_ms": f"{result.ttft:.6f}", "tpot_ms": f"{result.tpot:.6f}", "database": version or "default",
                "reason": ""}
    return line


def common_rows(compare: Any, peer: Any) -> tuple[Any, Any]:
    """`compare`'s mean TTFT and TPOT rows of the points both predicted, with servesim's prediction
    as `simulated`, and the same rows with aiconfigurator's. `compare`: `simulate compare --out`
    rows; `peer`: `predict`'s lines (ms)."""
    import polars as pl

    ours = compare.filter(pl.col("statistic").is_in(["ttft_mean", "tpot_mean"]))
    theirs = (peer.unpivot(index="id", on=["ttft_ms", "tpot_ms"], variable_name="statistic", value_name="peer")
              .select(point="id", statistic=pl.col("statistic").str.replace("_ms", "_mean"),
                      peer=pl.col("peer").cast(pl.Float64) / 1e3))
    joined = ours.join(theirs, on=["point", "statistic"], how="left")
    lacking = joined.filter(pl.col("peer").is_null() | pl.col("simulated").is_nan())["point"].unique()
    ours = joined.filter(~pl.col("point").is_in(lacking.implode())).filter(pl.len().over("point") == 2)
    return ours.drop("peer"), ours.with_columns(simulated=pl.col("peer")).drop("peer")


def side_by_side(compare: Any, peer: Any, by: tuple[str, ...] = ("backend",)) -> Any:
    """One row per stack (and per `by`) and scope (`all`, `held out`): the points both predicted
    and each one's median |error| of mean TTFT and TPOT (`common_rows`)."""
    import polars as pl

    from simulator.sim2real.compare import with_fitted

    ours, theirs = common_rows(compare, peer)
    both = with_fitted(ours.join(theirs.select("point", "statistic", peer="simulated"), on=["point", "statistic"]))

    def error(predicted: str, statistic: str) -> pl.Expr:
        chosen = pl.col("statistic") == statistic
        return (pl.col(predicted) / pl.col("measured") - 1).abs().filter(chosen).median()

    medians = [pl.col("point").n_unique().alias("rows"), error("simulated", "ttft_mean").alias("servesim_ttft"),
               error("peer", "ttft_mean").alias("aiconfigurator_ttft"),
               error("simulated", "tpot_mean").alias("servesim_tpot"),
               error("peer", "tpot_mean").alias("aiconfigurator_tpot")]
    scopes = [both.with_columns(scope=pl.lit("all")),
              both.filter(~pl.col("fitted")).with_columns(scope=pl.lit("held out"))]
    return pl.concat([part.group_by(*by, "scope").agg(medians) for part in scopes]).sort(*by, "scope")


def regrets(compare: Any, peer: Any) -> Any:
    """Per stack: the planning regret (`simulator.sim2real.regret`) of servesim's predictions and of
    aiconfigurator's, on the same cases: the aggregated points both predicted."""

    from simulator.sim2real.regret import planning_regret, regret_summary

    ours, theirs = common_rows(compare, peer)
    mine, peers = (regret_summary(planning_regret(rows)) for rows in (ours, theirs))
    return (mine.select("stack", "cases", servesim="regret")
            .join(peers.select("stack", aiconfigurator="regret"), on="stack").sort("stack"))


def print_side_by_side(compare_file: Path, peer_file: Path) -> None:
    import polars as pl

    compare = pl.read_parquet(compare_file)
    peer = pl.read_csv(peer_file, infer_schema_length=0)
    predicted = peer.filter(pl.col("ttft_ms").is_not_null() & (pl.col("ttft_ms") != "")).height
    print(f"aiconfigurator predicted {predicted} of {peer.height} rows; servesim {compare['point'].n_unique()}")
    print("median |error| of mean TTFT and TPOT on the rows both predicted (held out: no servesim fit used them):")
    print(f"{'stack':<8}{'scope':<10}{'rows':>5}{'TTFT servesim':>15}{'aiconfigurator':>16}{'TPOT servesim':>15}"
          f"{'aiconfigurator':>16}")
    for r in side_by_side(compare, peer).iter_rows(named=True):
        print(f"{r['backend']:<8}{r['scope']:<10}{r['rows']:>5}{r['servesim_ttft']:>15.1%}"
              f"{r['aiconfigurator_ttft']:>16.1%}{r['servesim_tpot']:>15.1%}{r['aiconfigurator_tpot']:>16.1%}")
    print("the same per group (all rows both predicted), servesim then aiconfigurator:")
    print(f"{'stack':<8}{'group':<36}{'rows':>5}{'TTFT':>9}{'':>9}{'TPOT':>9}")
    for r in side_by_side(compare, peer, ("backend", "group")).filter(pl.col("scope") == "all").iter_rows(named=True):
        print(f"{r['backend']:<8}{r['group']:<36}{r['rows']:>5}{r['servesim_ttft']:>9.1%}{r['aiconfigurator_ttft']:>9.1%}"
              f"{r['servesim_tpot']:>9.1%}{r['aiconfigurator_tpot']:>9.1%}")
    print("planning regret on the same aggregated rows (simulator.sim2real.regret):")
    for r in regrets(compare, peer).iter_rows(named=True):
        print(f"{r['stack']:<8}{r['cases']:>5} cases  servesim {r['servesim']:.1%}  aiconfigurator "
              f"{r['aiconfigurator']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("predict", help="aiconfigurator's TTFT and TPOT of every row, as CSV on stdout")
    run.add_argument("--silicon", type=Path, default=SILICON)
    both = commands.add_parser("side-by-side", help="both tools' median |error| on the rows both predicted")
    both.add_argument("compare", type=Path, help="simulate compare --out file of the same table")
    both.add_argument("peer", type=Path, help="predict's CSV")
    args = parser.parse_args()
    if args.command == "predict":
        predict(args.silicon)
    else:
        print_side_by_side(args.compare, args.peer)


if __name__ == "__main__":
    main()
