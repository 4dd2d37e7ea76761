"""Check a profile: predicted against measured whole-step times, the chapter's decode table, and
vLLM's measured single-request decode.

For every whole forward pass the calibration script measured (the profile's `validation.parquet`),
the measured-kernel cost model predicts the same step from the profile's operator tables; the error
is (predicted - measured) / measured. Then Llama-3.1-8B's decode steps at 2,300-token contexts and a
2,000-token prefill on the profile, against the chapter's numbers (a bf16 server on one H100; other
deployment settings show how far they move it). Last, Llama-3.1-8B's batch-1 decode step against
the single-request ITL lines vLLM's fp8-KV blog measured on an H100 (../shared/reference/serving/
vllm_blog_fp8_kv_h100.csv), for the KV dtype asked for. A profile whose host overhead `simulate fit`
fitted shows first the fitted terms, the data they were fitted on and every residual.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import click
import polars as pl

from simulator.cli.options import deployment_options
from simulator.config import RunConfig
from simulator.cost import CostModel, MeasuredCost, StepShape, build_cost_model, build_tables
from simulator.deploy.hardware import FIT_SHAPE, has_shape, load_profile, profile_dir
from simulator.deploy.model import LLAMA_3_1_8B, ModelSpec
from simulator.errors import InputError

CHAPTER_CONTEXT = 2300
CHAPTER_DECODE = {1: 7.0e-3, 8: 7.8e-3, 64: 14.1e-3, 128: 21.7e-3}
CHAPTER_PREFILL = (2000, 80e-3)
VLLM_FP8_KV_BLOG = Path("serving") / "vllm_blog_fp8_kv_h100.csv"
"""vLLM's fp8-KV blog's measurements, in the reference data folder."""
REFERENCE_ENV = "SERVESIM_REFERENCE"
SINGLE_REQUEST_CONTEXTS = (8000, 64000)


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


def chapter_errors(profile_name: str, config: RunConfig | None = None) -> pl.DataFrame:
    """Llama-3.1-8B on the profile against the chapter: decode steps by batch, and the prefill, with
    the measured-kernel model under `config`'s deployment settings (default: one GPU, bf16)."""
    config = config or RunConfig(cost="measured", gpu=profile_name)
    deployed = LLAMA_3_1_8B.deployed(config.quantization, config.kv_cache_dtype)
    cost = MeasuredCost(build_tables(deployed, load_profile(profile_name), config.tensor_parallel_size))
    rows = [{"step": f"decode batch {batch}", "chapter": seconds,
             "predicted": cost.step_time(StepShape.from_rows([(1, CHAPTER_CONTEXT)] * batch))}
            for batch, seconds in CHAPTER_DECODE.items()]
    tokens, seconds = CHAPTER_PREFILL
    rows.append({"step": f"prefill {tokens} tokens", "chapter": seconds,
                 "predicted": cost.step_time(StepShape.from_rows([(tokens, tokens)]))})
    return pl.DataFrame(rows).with_columns(error=(pl.col("predicted") - pl.col("chapter")) / pl.col("chapter"))


def reference_folders() -> tuple[Path, ...]:
    """Where the reference data is looked for when not given: `../shared/reference` beside the
    checkout this module is in (an editable install; where the tests look), and beside the checkout
    in the current folder (`pip install .` run from it)."""
    return (Path(__file__).resolve().parents[2] / "shared" / "reference",
            Path.cwd().resolve().parent / "shared" / "reference")


def find_blog(reference: Path | None) -> Path | None:
    """The blog's measurements in `reference` (which must hold them), else in the first reference
    folder that does; None where none does."""
    if reference is not None:
        if not (reference / VLLM_FP8_KV_BLOG).is_file():
            raise InputError(f"--reference {str(reference)!r} holds no {VLLM_FP8_KV_BLOG} (give the reference data "
                             "folder, ../shared/reference beside the checkout)")
        return reference / VLLM_FP8_KV_BLOG
    return next((folder / VLLM_FP8_KV_BLOG for folder in reference_folders() if (folder / VLLM_FP8_KV_BLOG).is_file()),
                None)


def vllm_itl_lines(path: Path) -> dict[str, tuple[float, float]]:
    """vLLM's fitted single-request ITL, seconds = intercept + slope x context, by KV dtype."""
    try:
        rows = pl.read_csv(path).filter(pl.col("benchmark") == "single_request_itl_fit")
        lines = {}
        for dtype in ("bfloat16", "fp8"):
            values = dict(rows.filter(pl.col("kv_cache_dtype") == dtype).select("metric", "value").iter_rows())
            intercept, slope = float(values["itl_intercept"]), float(values["itl_slope"])
            if not (math.isfinite(intercept) and intercept > 0 and math.isfinite(slope) and slope >= 0):
                raise ValueError(f"{dtype} intercept {intercept!r} ms, slope {slope!r} ms per token: an ITL line "
                                 "takes a positive intercept and a slope of at least 0")
            lines[dtype] = (intercept * 1e-3, slope * 1e-3)
    except (pl.exceptions.PolarsError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{str(path)!r} is not the blog's table of single_request_itl_fit rows (itl_intercept, "
                         f"itl_slope by kv_cache_dtype): {exc!r}"[:300]) from None
    return lines


def single_request_errors(cost: CostModel, line: tuple[float, float]) -> pl.DataFrame:
    """Batch-1 decode steps at the blog's context lengths against its fitted ITL line (intercept, slope)."""
    intercept, slope = line
    rows = [{"context": context, "vllm": intercept + slope * context,
             "predicted": cost.step_time(StepShape(1, 1, context))} for context in SINGLE_REQUEST_CONTEXTS]
    return pl.DataFrame(rows).with_columns(error=(pl.col("predicted") - pl.col("vllm")) / pl.col("vllm"))


def print_single_request(config: RunConfig, lines: dict[str, tuple[float, float]] | None) -> None:
    """Llama-3.1-8B's batch-1 decode step against the blog's ITL line (one GPU: the blog's), with
    the measured-kernel model and the roofline; one line saying why where there is none."""
    if config.tensor_parallel_size > 1:
        return
    if lines is None:
        click.echo(f"\nno comparison with vLLM's measured single-request ITL: {VLLM_FP8_KV_BLOG} is not in "
                   f"{' or '.join(repr(str(f)) for f in reference_folders())}; give --reference DIR or set "
                   f"{REFERENCE_ENV}")
        return
    kv = "fp8" if config.kv_cache_dtype.startswith("fp8") else "bfloat16"
    click.echo(f"\nllama-3.1-8b batch-1 decode step, {kv} KV, against vLLM's measured single-request ITL "
               f"(fp8-KV blog, H100):")
    click.echo(f"{'context':>8}{'vLLM ms':>10}{'measured ms':>13}{'error':>9}{'roofline ms':>13}{'error':>9}")
    gpu = load_profile(config.gpu).gpu
    measured = single_request_errors(build_cost_model(config, LLAMA_3_1_8B, gpu), lines[kv])
    roofline = single_request_errors(build_cost_model(replace(config, cost="roofline"), LLAMA_3_1_8B, gpu), lines[kv])
    for m, r in zip(measured.iter_rows(named=True), roofline.iter_rows(named=True), strict=True):
        click.echo(f"{m['context']:>8}{m['vllm'] * 1e3:>10.2f}{m['predicted'] * 1e3:>13.2f}{m['error']:>+9.1%}"
                   f"{r['predicted'] * 1e3:>13.2f}{r['error']:>+9.1%}")


@click.command("validate")
@click.option("--gpu", default="h100_sxm", show_default=True, help="Shipped profile name or a profile path.")
@deployment_options
@click.option("--reference", type=click.Path(path_type=Path), default=None, envvar=REFERENCE_ENV, show_envvar=True,
              help="The reference data folder (../shared/reference beside the checkout), for vLLM's measured "
                   "single-request ITL [default: looked for beside the checkout].")
def validate_command(gpu: str, tensor_parallel_size: int, quantization: str | None, kv_cache_dtype: str,
                     reference: Path | None) -> None:
    """Predicted against measured step times for a profile, the chapter's table, and vLLM."""
    if not (profile_dir(gpu) / "profile.json").is_file():
        raise InputError(f"--gpu {gpu!r} has no profile.json: it holds a roofline only, no measured kernels to "
                         "validate (`simulate calibrate` measures them)")
    blog = find_blog(reference)
    lines = vllm_itl_lines(blog) if blog is not None else None  # refused, if it is bad, before anything prints
    config = RunConfig(gpu=gpu, cost="measured", tensor_parallel_size=tensor_parallel_size,
                       quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    fit = load_profile(gpu).meta.get("host_overhead_fit")
    if isinstance(fit, dict) and has_shape(fit, FIT_SHAPE):
        from calibration.fit_host import describe_fit

        click.echo("\n".join(describe_fit(fit)) + "\n")
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
        chapter = chapter_errors(gpu, config)
    except InputError as exc:
        click.echo(f"\nno chapter table on this profile: {exc}")
        return
    deployment = (f" at --tensor-parallel-size {tensor_parallel_size}, --quantization {quantization}, "
                  f"--kv-cache-dtype {kv_cache_dtype}")
    click.echo(f"\nllama-3.1-8b on {gpu}, {CHAPTER_CONTEXT}-token contexts, against the chapter (an H100)"
               + (deployment if config != RunConfig(gpu=gpu, cost="measured") else "") + ":")
    click.echo(f"{'step':<22}{'chapter ms':>12}{'predicted ms':>14}{'error':>9}")
    for r in chapter.iter_rows(named=True):
        click.echo(f"{r['step']!s:<22}{r['chapter'] * 1e3:>12.1f}{r['predicted'] * 1e3:>14.2f}{r['error']:>+9.1%}")
    print_single_request(config, lines)
