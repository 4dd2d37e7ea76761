"""`simulate fit`: the host-overhead terms of a GPU profile fitted by least squares to measured
serving results, over servesim's own predictions of them.

The terms (seconds, all >= 0) are those the cost models add to every step (`simulator.cost.roofline.
host_overhead`): `step_overhead` per step, `per_sequence_overhead` per sequence in the step,
`per_token_overhead` per token computed in it; and `client_time`, the mean per-request time outside
the engine that a client's TTFT counts (`simulator.sim2real.replay`).

The fit is Gauss-Newton on the simulator: each round reruns every fitted point with the current
terms, and takes the derivatives from the run itself. A request's TTFT is the sum of the steps
under it, so d TTFT / d step_overhead is the number of those steps, d TTFT / d per_sequence_overhead
the sequences in them, d TTFT / d per_token_overhead their tokens, and d TTFT / d client_time is 1;
TPOT likewise over its decode steps, per output token. The relative residuals (simulated -
measured) / measured, linearised so, are solved with bounds >= 0 (scipy's `lsq_linear`), and the
round's terms rerun; rounds stop when the terms move by less than 1% of their value (or 1 ns) or
after `ROUNDS`.

Each term is fitted to the measurement that observes it: the three per-step terms to the points'
mean TPOT (a request's TPOT is the mean length of the steps it decodes in, so it measures step
time directly), `client_time` to their mean TTFT. A TTFT is mostly waiting: how prompts batch
into steps (closed-loop waves, see `simulator.sim2real.replay`) decides it more than any step's host time,
and fitting step terms to it would let a scheduling miss pass for negative host time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import polars as pl

from simulator.errors import InputError
from simulator.outputs.run_folder import remove_stale_scratch, scratch_dir

if TYPE_CHECKING:
    from simulator.sim2real.points import MeasuredPoint
    from simulator.sim2real.sweeps import Hypothesis

TERMS = ("step_overhead", "per_sequence_overhead", "per_token_overhead", "client_time")
UNITS = {"step_overhead": "s per step", "per_sequence_overhead": "s per sequence in a step",
         "per_token_overhead": "s per token computed in a step", "client_time": "s per request (mean)"}
FITTED_STATISTICS = ("ttft_mean", "tpot_mean")
ROUNDS = 6


@dataclass(frozen=True)
class Fit:
    values: dict[str, float]
    residuals: pl.DataFrame
    """One row per point and statistic: measured, simulated with the fitted terms, error, held_out."""
    rounds: int


def write_profile(base: Path, out: Path, values: dict[str, float], fit: dict[str, Any] | None) -> None:
    """`base`'s profile with the host-overhead terms set to `values`; `fit` recorded in profile.json."""
    if out.exists() and any(out.iterdir()):
        raise InputError(f"--out {str(out)!r} already exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(out.parent)
    with scratch_dir(out) as scratch:  # as a run folder: whole or not at all, of the umask's mode
        for path in base.iterdir():
            if path.is_file():
                shutil.copy2(path, scratch / path.name)
        roofline = json.loads((base / "roofline.json").read_text())
        roofline |= {name: values[name] for name in TERMS[:3]}
        (scratch / "roofline.json").write_text(json.dumps(roofline, indent=2) + "\n")
        meta = json.loads((base / "profile.json").read_text())
        meta["step_overhead"] = values["step_overhead"]
        if fit is not None:
            meta["host_overhead_fit"] = fit
            on = fit["fitted_on"]
            said = (f"fitted by `simulate fit` (calibration/fit_host.py) to the mean TPOT of {on['points']} measured "
                    f"points of {', '.join(on['files'])} ({on.get('weights')} weights, tensor parallel "
                    f"{on.get('tensor_parallel_sizes')}); values, units and residuals in host_overhead_fit")
            meta["families"] |= dict.fromkeys(TERMS[:3], said)
        (scratch / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(scratch, out)


Rerun = Callable[[list[Any], str], list[tuple[Any, Any]]]
"""Reruns points on a profile: (point, its Replay) pairs (`simulator.sim2real.sweeps`)."""


def one_by_one(points: list[Any], gpu: str) -> list[tuple[Any, Any]]:
    """Each point rerun alone, cold, with vLLM's default scheduler (the replay before sweeps)."""
    from simulator.sim2real.compare import rerun

    return [(point, rerun(point, gpu)) for point in points]


def _run(points: list[Any], base: Path, values: dict[str, float], work: Path, round_: int,
         rerun: Rerun = one_by_one) -> tuple[pl.DataFrame, np.ndarray]:
    """Every point rerun with `values`: its residual rows and, per fitted statistic, d/d terms."""
    from simulator.sim2real.compare import simulated_statistics

    folder = work / f"round{round_}"
    write_profile(base, folder, values, {"values": values, "fitted_on": {"files": ["a round"], "points": len(points)}})
    rows, jacobian = [], []
    for point, replay in rerun(points, str(folder)):
        simulated = simulated_statistics(replay, set(FITTED_STATISTICS))
        # TTFT observes the client time only, TPOT the per-step terms only (module docstring).
        slopes = {"ttft_mean": np.array([0.0, 0.0, 0.0, 1.0]),
                  "tpot_mean": np.append(np.nanmean(replay.tpot_sums, axis=0), 0.0)}
        for statistic in FITTED_STATISTICS:
            if statistic in point.measured:
                measured = point.measured[statistic]
                rows.append({"point": point.name, "tensor_parallel_size": point.tensor_parallel_size,
                             "statistic": statistic, "measured": measured, "simulated": simulated[statistic],
                             "error": (simulated[statistic] - measured) / measured})
                jacobian.append(slopes[statistic] / measured)
    return pl.DataFrame(rows), np.array(jacobian)


def fit_terms(points: list[Any], held_out: list[Any], base: Path, rerun: Rerun = one_by_one,
              terms: tuple[str, ...] = TERMS) -> Fit:
    """Least squares of `terms` (the others 0) over `points`; `held_out` rerun with the result, not fitted."""
    from scipy.optimize import lsq_linear

    values = dict.fromkeys(TERMS, 0.0)
    free = np.array([name in terms for name in TERMS])
    round_ = 0
    with tempfile.TemporaryDirectory(prefix="servesim-fit-") as work:
        for round_ in range(ROUNDS if terms else 0):
            rows, jacobian = _run(points, base, values, Path(work), round_, rerun)
            theta = np.array([values[name] for name in TERMS])
            solved = np.zeros(len(TERMS))
            # Points that cannot tell two terms apart (their slopes in proportion: two points at one
            # TP) make the trust-region steps divide by 0 on the way to the bounded least squares
            # solution, which is found all the same; numpy's warning about it is not the user's.
            with np.errstate(invalid="ignore", divide="ignore"):
                solved[free] = lsq_linear(jacobian[:, free], jacobian @ theta - rows["error"].to_numpy(),
                                          bounds=(0, np.inf)).x
            if not np.isfinite(solved).all():
                raise InputError(f"the host terms could not be fitted to these {len(points)} points (the least "
                                 "squares gave no finite solution): fit on more points")
            moved = np.abs(solved - theta) > np.maximum(0.01 * np.abs(theta), 1e-9)
            values = dict(zip(TERMS, (float(v) for v in solved), strict=True))
            if not moved.any():
                break
        values = {name: round(value, 10) for name, value in values.items()}  # 0.1 ns: lsq_linear leaves 1e-300s
        fitted, _ = _run(points, base, values, Path(work), ROUNDS, rerun)
        others = _run(held_out, base, values, Path(work), ROUNDS + 1, rerun)[0] if held_out else fitted.clear()
    residuals = pl.concat([fitted.with_columns(held_out=pl.lit(False)), others.with_columns(held_out=pl.lit(True))])
    return Fit(values, residuals, round_ + 1)


TERM_SETS = (TERMS, TERMS[:3], TERMS[:1], ())
"""The terms tried in turn until none makes a held-out group worse than the kernels alone: all, the
per-step ones, the step overhead, none. A term is judged on the statistic it is fitted to (the step
terms on TPOT, the client time on TTFT, module docstring); what it does to the other is recorded."""


def group_errors(residuals: pl.DataFrame) -> dict[tuple[int, str], float]:
    """Median |error| of the held-out rows per (tensor parallel size, statistic)."""
    held = residuals.filter(pl.col("held_out"))
    table = held.group_by("tensor_parallel_size", "statistic").agg(pl.col("error").abs().median())
    return {(tp, stat): float(e) for tp, stat, e in table.iter_rows()}


def fit_held_out(points: list[Any], held_out: list[Any], base: Path, rerun: Rerun = one_by_one,
                 kernels_alone: pl.DataFrame | None = None) -> tuple[Fit, dict[tuple[int, str], float], list[str]]:
    """The fit of the most terms of `TERM_SETS` that leaves every held-out group (a tensor parallel
    size) no worse than the kernels alone on the statistics they are fitted to; with the
    kernels-only errors and what was dropped. `kernels_alone`: the held-out points' residuals on
    the kernels alone where already rerun as `rerun` would (`ran_as_stated`), else rerun here."""
    if kernels_alone is None:
        alone = group_errors(fit_terms(points, held_out, base, rerun, ()).residuals) if held_out else {}
    else:
        names = [p.name for p in held_out]
        alone = group_errors(kernels_alone.filter(pl.col("point").is_in(names)).with_columns(held_out=pl.lit(True)))
    dropped: list[str] = []
    for terms in TERM_SETS:
        fit = fit_terms(points, held_out, base, rerun, terms)
        judged = {"tpot_mean"} if set(terms) & set(TERMS[:3]) else set()
        judged |= {"ttft_mean"} if "client_time" in terms else set()
        worse = [key for key, error in group_errors(fit.residuals).items()
                 if key[1] in judged and error > alone[key] + 1e-9]
        if not worse:
            return fit, alone, dropped
        dropped.append(f"{'+'.join(terms)}: held-out TP {worse[0][0]} {worse[0][1]} worse than kernels alone")
    raise AssertionError("the empty set of terms is the kernels alone")


def median_errors(residuals: pl.DataFrame) -> dict[str, dict[str, float]]:
    """Median |error| per statistic, of the fitted and of the held-out points."""
    table: dict[str, dict[str, float]] = {}
    for held, name in ((False, "fitted"), (True, "held_out")):
        part = residuals.filter(pl.col("held_out") == held)
        if part.height:
            table[name] = {statistic: float(np.median(np.abs(part.filter(pl.col("statistic") == statistic)["error"])))
                           for statistic in FITTED_STATISTICS}
    return table


def served_as_stated(points: list[MeasuredPoint], gpu: str, hypothesis: Hypothesis) -> list[MeasuredPoint]:
    """`points` less those whose measured decode needs more memory bandwidth than their GPU has, rerun
    as `hypothesis` says (`simulator.sim2real.bandwidth`): no host time can fit a point that ran
    something it does not state, and one would pull every term down. Says which it leaves out."""
    from simulator.sim2real.bandwidth import point_share
    from simulator.sim2real.compare import point_config
    from simulator.sim2real.sweeps import Unit

    kept: list[tuple[MeasuredPoint, float]] = []
    over: list[tuple[MeasuredPoint, float]] = []
    for point in points:
        share = point_share(point, point_config(point, gpu, 0, hypothesis.scheduler_for(Unit((point,)))))
        (over if share > 1 else kept).append((point, share))
    if over:
        click.echo(f"left out {len(over)} points whose decode needs more memory bandwidth than the GPU has, rerun as "
                   "stated: " + ", ".join(f"{p.name} ({share:.0%})" for p, share in over[:5])
                   + (f" and {len(over) - 5} more" if len(over) > 5 else ""))
    if not kept:
        raise InputError(f"every point ({len(points)}) needs more memory bandwidth than its GPU has, rerun as "
                         "stated (simulator/sim2real/bandwidth.py): nothing to fit")
    return [point for point, _ in kept]


def ran_as_stated(points: list[MeasuredPoint], base: Path, rerun: Rerun
                  ) -> tuple[list[MeasuredPoint], pl.DataFrame]:
    """`points` less the closed-loop ones whose measured server decoded under half as many requests
    at once as their kernels-alone rerun does (`simulator.sim2real.inflight`, Little's law on the
    mean TTFT and TPOT): a term per sequence or step would be fitted, or judged, on a batch the
    server never ran (a smaller KV cache, a lower max-num-seqs, a capped client). Says which. With
    the kernels-alone residuals of every point (`fit_terms`' rows)."""
    from simulator.sim2real.inflight import fewer_at_once

    residuals = fit_terms(points, [], base, rerun, ()).residuals
    if residuals.is_empty():
        return points, residuals
    shape = pl.DataFrame([{"point": p.name, "gpu": p.gpu, "concurrency": p.concurrency, "rate": p.rate,
                           "output_len": float(p.output_lens[0]) if len(p.output_lens) == 1 else None}
                          for p in points], schema={"point": pl.String, "gpu": pl.String, "concurrency": pl.Int64,
                                                    "rate": pl.Float64, "output_len": pl.Float64})
    fewer, _ = fewer_at_once(residuals.join(shape, on="point"))
    if fewer.is_empty():
        return points, residuals
    click.echo(f"left out {fewer.height} points whose server decoded under half as many requests at once as their "
               "rerun: " + ", ".join(f"{r['point']} ({r['measured']:.1f} of {r['simulated']:.1f})"
                                     for r in fewer.head(5).iter_rows(named=True))
               + (f" and {fewer.height - 5} more" if fewer.height > 5 else ""))
    left = set(fewer["point"].to_list())
    return [point for point in points if point.name not in left], residuals


@click.command("fit")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--gpu", required=True, help="The profile to fit (shipped name or folder); the points measured on "
                                           "its GPU are used (a vLLM result, which does not say, counts as its "
                                           "GPU's at TP 1).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder of the fitted profile.")
@click.option("--fit-tp", "fit_tp", type=int, multiple=True,
              help="Fit on the points of these tensor parallel sizes only and report the others as held out "
                   "(repeat: --fit-tp 2 --fit-tp 8) [default: fit on all].")
@click.option("--quantization", type=click.Choice(["none", "fp8"]), default="none", show_default=True,
              help="The weight dtype of the points used: none (bf16) or fp8.")
@click.option("--backend", type=click.Choice(["vllm", "sglang", "trtllm"]), default="vllm", show_default=True,
              help="The serving stack whose points are used.")
@click.option("--scheduler", type=click.Choice(["vllm-default", "stock", "bench"]), default="vllm-default",
              show_default=True, help="The servers' scheduler the reruns assume: vLLM serve's H100 defaults, the "
                                      "stack's own, or aiconfigurator's benchmark templates (max batch + isl + 1500).")
@click.option("--num-dataset-entries", type=click.IntRange(1), default=None,
              help="The client's prompt pool the reruns assume (aiperf's default 100) [default: none].")
@click.option("--model", "models", multiple=True,
              help="Fit on the rows of this model only (servesim's name, e.g. qwen3-32b; repeat for several) "
                   "[default: every model].")
@click.option("--sweep/--no-sweep", default=False, show_default=True,
              help="Rerun a server's concurrency levels back to back, its prefix cache kept.")
@click.option("--disable-custom-all-reduce", is_flag=True,
              help="Rerun every all-reduce as NCCL's, the stack's custom all-reduce off (what SGLang's rows of "
                   "aiconfigurator's table support: docs/validation/stack-fidelity.md).")
def fit_command(results: tuple[Path, ...], gpu: str, out: Path, fit_tp: tuple[int, ...], quantization: str,
                backend: str, scheduler: str, num_dataset_entries: int | None, models: tuple[str, ...],
                sweep: bool, disable_custom_all_reduce: bool) -> None:
    """Fit a profile's host overhead to measured results by least squares and write the profile.
    With held-out points, a term that leaves a held-out group worse than the kernels alone is dropped."""
    from simulator.deploy.hardware import load_gpu, profile_dir
    from simulator.outputs.run_folder import check_writable
    from simulator.sim2real.measured import read_points
    from simulator.sim2real.sweeps import Hypothesis

    base = profile_dir(gpu)
    name = load_gpu(gpu).name
    check_writable(out, "--out", inside=True)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {str(out)!r} already exists and is not an empty folder")
    wanted = None if quantization == "none" else quantization
    # A vLLM result does not record its GPU: it is taken as measured on --gpu's, at TP 1.
    points = [replace(p, gpu=p.gpu or name) for path in results for p in read_points(path)]
    # One server's host terms: aggregated rows only (a disaggregated row's GPUs are two pools').
    points = [p for p in points if p.gpu == name and p.quantization == wanted and p.backend == backend
              and p.mode == "agg" and (not models or p.model in models)]
    if not points:
        raise InputError(f"no point of {', '.join(str(r) for r in results)} was measured on {name} with "
                         f"--quantization {quantization} and --backend {backend}")
    hypothesis = Hypothesis(scheduler, num_dataset_entries, sweep, disable_custom_all_reduce)
    points = served_as_stated(points, str(base), hypothesis)
    rerun: Rerun = hypothesis.rerun  # type: ignore[assignment]
    kept, kernels_alone = ran_as_stated(points, base, rerun)
    # A point reruns alone, or with its server's other levels (--sweep): leaving points out changes
    # a sweep's reruns, so the kernels-alone rows are kept for the held-out judgment only if not.
    reusable = not sweep or len(kept) == len(points)
    points = kept
    fitted = [p for p in points if not fit_tp or p.tensor_parallel_size in fit_tp]
    held_out = [p for p in points if p not in fitted]
    if not fitted:
        raise InputError(f"--fit-tp {' '.join(map(str, fit_tp))}: no point has that tensor parallel size")
    click.echo(f"fitting {len(fitted)} points ({len(held_out)} held out) on {name}...")
    if held_out:
        fit, alone, dropped = fit_held_out(fitted, held_out, base, rerun, kernels_alone if reusable else None)
    else:
        fit, alone, dropped = fit_terms(fitted, held_out, base, rerun), {}, []
    record = {
        "values": fit.values, "units": UNITS,
        "fitted_on": {"files": [str(r) for r in results], "points": len(fitted), "gpu": name,
                      "weights": "bf16" if quantization == "none" else quantization,
                      "tensor_parallel_sizes": sorted(set(fit_tp)) or "all", "statistics": list(FITTED_STATISTICS),
                      "backend": backend, "assumed": {"scheduler": scheduler, "num_dataset_entries":
                                                      num_dataset_entries, "sweep": sweep,
                                                      "disable_custom_all_reduce": disable_custom_all_reduce}},
        "method": "Gauss-Newton on servesim's reruns, relative residuals, terms >= 0 (calibration/fit_host.py), "
                  f"{fit.rounds} rounds",
        "median_abs_error": median_errors(fit.residuals),
        "held_out_kernels_alone": {f"tp{tp} {stat}": error for (tp, stat), error in sorted(alone.items())},
        "dropped": dropped,
        "residuals": fit.residuals.to_dicts(),
    }
    write_profile(base, out, fit.values, record)
    for term in TERMS:
        click.echo(f"  {term:<24}{fit.values[term] * 1e6:>12.2f} us  ({UNITS[term]})")
    for part, errors in record["median_abs_error"].items():  # type: ignore[attr-defined]
        click.echo(f"  median |error| {part:<9}" + "  ".join(f"{s} {e:.1%}" for s, e in errors.items()))
    for key, error in record["held_out_kernels_alone"].items():  # type: ignore[attr-defined]
        click.echo(f"  held out {key:<16} kernels alone {error:.1%}")
    for line in dropped:
        click.echo(f"  not shipped: {line}")
    click.echo(f"wrote {out}")


def describe_fit(fit: dict[str, Any]) -> list[str]:
    """A profile's `host_overhead_fit` as `simulate validate` prints it: terms, data, residuals."""
    on = fit["fitted_on"]
    lines = [f"host overhead fitted by `simulate fit` on {on['points']} points of {', '.join(on['files'])} "
             f"({on['weights']} weights, tensor parallel {on['tensor_parallel_sizes']}, "
             f"on {', '.join(on['statistics'])}):"]
    lines += [f"  {term:<24}{fit['values'][term] * 1e6:>12.3f} us  ({fit['units'][term]})" for term in TERMS]
    if "note" in fit:
        lines.append(f"  note: {fit['note']}")
    if isinstance(on.get("assumed"), dict):
        lines.append(f"  reruns assumed: {on.get('backend', 'vllm')} rows, " + ", ".join(
            f"{key} {value}" for key, value in on["assumed"].items()))
    lines += [f"  not kept: {line}" for line in fit.get("dropped", []) if isinstance(line, str)]
    for part, errors in fit["median_abs_error"].items():
        lines.append(f"  median |error| {part:<9}" + "  ".join(f"{s} {e:.1%}" for s, e in errors.items()))
    lines.append(f"  {'point':<46}{'TP':>3}{'statistic':>11}{'measured ms':>13}{'fitted ms':>11}{'error':>9}")
    for r in fit["residuals"]:
        lines.append(f"  {str(r['point'])[-45:]:<46}{r['tensor_parallel_size']:>3}{r['statistic']:>11}"
                     f"{r['measured'] * 1e3:>13.2f}{r['simulated'] * 1e3:>11.2f}{r['error']:>+9.1%}"
                     + ("  held out" if r["held_out"] else ""))
    return lines
