"""Check a profile: predicted against measured whole-step times, and the chapter's decode table.

For every whole forward pass the calibration script measured (the profile's `validation.parquet`),
the measured-kernel cost model predicts the same step from the profile's operator tables; the error
is (predicted - measured) / measured. Then Llama-3.1-8B's decode steps at 2,300-token contexts and a
2,000-token prefill on the profile, against the chapter's numbers.
"""

from __future__ import annotations

import click
import polars as pl

from simulator.cost import MeasuredCost, StepShape, build_tables
from simulator.errors import InputError
from simulator.hardware import load_profile, profile_dir
from simulator.model import LLAMA_3_1_8B, ModelSpec

CHAPTER_CONTEXT = 2300
CHAPTER_DECODE = {1: 7.0e-3, 8: 7.8e-3, 64: 14.1e-3, 128: 21.7e-3}
CHAPTER_PREFILL = (2000, 80e-3)


def validation_errors(profile_name: str) -> pl.DataFrame:
    """One row per measured whole pass: its shape, measured and predicted seconds, relative error."""
    profile = load_profile(profile_name)
    if profile.validation is None or profile.meta.get("model") is None:
        return pl.DataFrame(schema={"kind": pl.String, "batch_size": pl.Int64, "new_tokens": pl.Int64,
                                    "context": pl.Int64, "latency": pl.Float64, "predicted": pl.Float64,
                                    "error": pl.Float64})
    cost = MeasuredCost(build_tables(ModelSpec(**profile.meta["model"]), profile))
    predicted = [cost.step_time(StepShape.from_rows([(row["new_tokens"], row["context"])] * row["batch_size"]))
                 for row in profile.validation.iter_rows(named=True)]
    return profile.validation.with_columns(predicted=pl.Series(predicted)).with_columns(
        error=(pl.col("predicted") - pl.col("latency")) / pl.col("latency"))


def chapter_errors(profile_name: str) -> pl.DataFrame:
    """Llama-3.1-8B on the profile against the chapter: decode steps by batch, and the prefill."""
    cost = MeasuredCost(build_tables(LLAMA_3_1_8B, load_profile(profile_name)))
    rows = [{"step": f"decode batch {batch}", "chapter": seconds,
             "predicted": cost.step_time(StepShape.from_rows([(1, CHAPTER_CONTEXT)] * batch))}
            for batch, seconds in CHAPTER_DECODE.items()]
    tokens, seconds = CHAPTER_PREFILL
    rows.append({"step": f"prefill {tokens} tokens", "chapter": seconds,
                 "predicted": cost.step_time(StepShape.from_rows([(tokens, tokens)]))})
    return pl.DataFrame(rows).with_columns(error=(pl.col("predicted") - pl.col("chapter")) / pl.col("chapter"))


@click.command("validate")
@click.option("--gpu", default="h100_sxm", show_default=True, help="Shipped profile name or a profile path.")
def validate_command(gpu: str) -> None:
    """Predicted against measured step times for a profile, and the chapter's table."""
    if not (profile_dir(gpu) / "profile.json").is_file():
        raise InputError(f"--gpu {gpu!r} has no profile.json: it holds a roofline only, no measured kernels to "
                         "validate (`simulate calibrate` measures them)")
    passes = validation_errors(gpu)
    if passes.height:
        meta = load_profile(gpu).meta
        click.echo(f"whole forward passes measured on {meta['device']} ({meta['model']['name']}):")
        click.echo(f"{'kind':<9}{'batch':>6}{'new':>7}{'context':>9}{'measured ms':>13}{'predicted ms':>14}"
                   f"{'error':>9}")
        for r in passes.iter_rows(named=True):
            click.echo(f"{r['kind']!s:<9}{r['batch_size']:>6}{r['new_tokens']:>7}{r['context']:>9}"
                       f"{r['latency'] * 1e3:>13.3f}{r['predicted'] * 1e3:>14.3f}{r['error']:>+9.1%}")
        errors = passes["error"].abs()
        click.echo(f"median |error| {float(errors.median()):.1%}, max {float(errors.max()):.1%}")  # type: ignore[arg-type]
    else:
        click.echo(f"profile {gpu} holds no whole-pass measurements (built from kernel data alone)")
    try:
        chapter = chapter_errors(gpu)
    except InputError as exc:
        click.echo(f"\nno chapter table on this profile: {exc}")
        return
    click.echo(f"\nllama-3.1-8b on {gpu}, {CHAPTER_CONTEXT}-token contexts, against the chapter (an H100):")
    click.echo(f"{'step':<22}{'chapter ms':>12}{'predicted ms':>14}{'error':>9}")
    for r in chapter.iter_rows(named=True):
        click.echo(f"{r['step']!s:<22}{r['chapter'] * 1e3:>12.1f}{r['predicted'] * 1e3:>14.2f}{r['error']:>+9.1%}")
