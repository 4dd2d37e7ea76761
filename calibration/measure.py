"""Measure a model's operators on this machine and write a profile the simulator can load.

On CUDA it builds the model's layers with random weights (no download), times every operator family
over a grid of shapes with CUDA events after warm-up, times whole forward passes (prefill of a few
lengths, decode at a few batch sizes and contexts) as a validation set, and writes a profile in the
format of `calibration/README.md`. `--device cpu` runs the same code path on the CPU (use the
built-in `tiny` model there: it finishes in seconds), which is how CI tests it end to end. The
model in PyTorch, and how its kernels differ from vLLM's, is `calibration.torch_model`.

Run: simulate calibrate --model llama-3.1-8b --out PROFILE   (or python -m calibration.measure ...)
Needs PyTorch: pip install ".[calibrate]".
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import polars as pl

from calibration.torch_model import Forward, Layers, elementwise_kernels
from simulator.cost import MeasuredCost, StepShape, build_tables, elementwise_ops
from simulator.deploy.hardware import TABLE_COLUMNS, load_profile
from simulator.deploy.model import ModelSpec, load_model
from simulator.errors import InputError, clip
from simulator.outputs.run_folder import check_out_dir

FORMAT = 1
# Operands are cycled through copies totalling at least this many bytes, more than the device's last
# cache level, as a model's layers each read their own weights and KV cache.
FLUSH_BYTES = {"cuda": 256 * 2**20, "cpu": 96 * 2**20}
MAX_COPIES = 8


@dataclass(frozen=True)
class Grid:
    """Shapes to measure and how hard to time them."""

    gemm_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_batches: tuple[int, ...]
    prefill_lengths: tuple[int, ...]
    elementwise_tokens: tuple[int, ...]
    max_kv_bytes: int
    """Largest KV cache one attention measurement may allocate."""
    max_prefill_tokens: int
    validation_prefill: tuple[int, ...]
    validation_decode: tuple[tuple[int, int], ...]
    """(batch, context) of whole decode passes."""
    probe: tuple[int, int]
    """(batch, context) of the decode pass that measures the per-step overhead (not validated)."""
    warmup: int
    trials: int
    min_trial_seconds: float


def powers(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(2**i for i in range(int(math.log2(lo)), int(math.log2(hi)) + 1))


GPU_GRID = Grid(
    gemm_tokens=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                 6144, 8192, 16384),
    decode_batches=powers(1, 512), decode_contexts=powers(16, 32768),
    prefill_batches=powers(1, 16), prefill_lengths=powers(16, 16384),
    elementwise_tokens=powers(1, 16384), max_kv_bytes=4 * 2**30, max_prefill_tokens=32768,
    validation_prefill=(128, 512, 2000), validation_decode=((1, 512), (1, 2300), (8, 2300), (64, 512), (64, 2300)),
    probe=(1, 32), warmup=3, trials=5, min_trial_seconds=0.005)
CPU_GRID = Grid(
    gemm_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    decode_batches=powers(1, 16), decode_contexts=powers(16, 1024),
    prefill_batches=powers(1, 4), prefill_lengths=powers(16, 512),
    elementwise_tokens=powers(1, 512), max_kv_bytes=64 * 2**20, max_prefill_tokens=1024,
    validation_prefill=(64, 256, 384), validation_decode=((1, 256), (4, 512), (8, 128), (16, 768)),
    probe=(1, 32), warmup=2, trials=5, min_trial_seconds=0.002)


class Timer:
    """Median seconds per call of a function, after warm-up: CUDA events on a GPU, a clock on the CPU."""

    def __init__(self, torch: Any, device: str, grid: Grid) -> None:
        self.torch, self.device, self.grid = torch, device, grid
        self.cuda = device.startswith("cuda")

    def _elapsed(self, fn: Callable[[], object], calls: int) -> float:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) * 1e-3  # events report ms
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - begin

    def __call__(self, fn: Callable[[], object]) -> float:
        with self.torch.inference_mode():
            for _ in range(self.grid.warmup):
                fn()
            once = max(self._elapsed(fn, 1), 1e-7)
            calls = max(1, math.ceil(self.grid.min_trial_seconds / once))
            return statistics.median(self._elapsed(fn, calls) / calls for _ in range(self.grid.trials))


def rotating(make: Callable[[], tuple[Any, ...]], nbytes: int, device: str) -> Callable[[], tuple[Any, ...]]:
    """A function returning the next of several copies of `make()`'s tensors, so timings read memory
    rather than a cache that a whole forward pass would not keep warm."""
    copies = [make() for _ in range(max(1, min(MAX_COPIES, math.ceil(FLUSH_BYTES[device.split(":")[0]] / nbytes))))]
    turn = iter(range(1 << 62))
    return lambda: copies[next(turn) % len(copies)]


def gemm_rows(layers: Layers, timer: Timer, grid: Grid, echo: Callable[[str], None]) -> list[dict[str, Any]]:
    model, rows = layers.model, []
    shapes = list(dict.fromkeys([*((n, k) for _, n, k in model.linear_shapes), (model.vocab_size, model.hidden_size)]))
    for n, k in shapes:
        weights = rotating(lambda n=n, k=k: (layers.randn(n, k),), n * k * model.dtype_bytes,  # type: ignore[misc]
                           layers.device)
        for m in grid.gemm_tokens:
            x = layers.randn(m, k)
            latency = timer(lambda x=x, weights=weights: layers.f.linear(x, weights()[0]))  # type: ignore[misc]
            rows.append({"m": m, "n": n, "k": k, "latency": latency})
        echo(f"  gemm n={n} k={k}: {len(grid.gemm_tokens)} sizes")
    return rows


def attention_rows(layers: Layers, timer: Timer, grid: Grid, echo: Callable[[str], None]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    model = layers.model
    heads = {"num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim}
    kv_bytes = model.kv_bytes_per_token_per_layer
    decode = []
    for b in grid.decode_batches:
        for c in grid.decode_contexts:
            if b * c * kv_bytes > grid.max_kv_bytes:
                continue
            operands = rotating(lambda b=b, c=c: (layers.randn(b, model.num_heads, 1, model.head_dim),  # type: ignore[misc]
                                                  layers.randn(b, model.num_kv_heads, c, model.head_dim),
                                                  layers.randn(b, model.num_kv_heads, c, model.head_dim)),
                                b * c * kv_bytes, layers.device)
            latency = timer(lambda operands=operands: layers.attention(*operands(), causal=False))  # type: ignore[misc]
            decode.append({"batch_size": b, "context": c, **heads, "latency": latency})
    echo(f"  decode attention: {len(decode)} shapes")
    prefill = []
    for b in grid.prefill_batches:
        for n in grid.prefill_lengths:
            if b * n > grid.max_prefill_tokens:
                continue
            operands = rotating(lambda b=b, n=n: (layers.randn(b, model.num_heads, n, model.head_dim),  # type: ignore[misc]
                                                  layers.randn(b, model.num_kv_heads, n, model.head_dim),
                                                  layers.randn(b, model.num_kv_heads, n, model.head_dim)),
                                b * n * kv_bytes, layers.device)
            latency = timer(lambda operands=operands: layers.attention(*operands(), causal=True))  # type: ignore[misc]
            prefill.append({"batch_size": b, "new_tokens": n, "context": n, **heads, "latency": latency})
    echo(f"  prefill attention: {len(prefill)} shapes")
    return prefill, decode


def elementwise_rows(layers: Layers, timer: Timer, grid: Grid, echo: Callable[[str], None]) -> list[dict[str, Any]]:
    unit_bytes = {op: nbytes for op, _, _, nbytes in elementwise_ops(layers.model)}
    rows = []
    for t in grid.elementwise_tokens:
        for op, fn in elementwise_kernels(layers, t).items():
            rows.append({"op": op, "tokens": t, "bytes": t * unit_bytes[op], "latency": timer(fn)})
    echo(f"  elementwise: {len(rows)} shapes")
    return rows


def device_memory(torch: Any, device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fit_rates(tables: dict[str, pl.DataFrame], model: ModelSpec) -> dict[str, float]:
    """Roofline constants from this profile's own tables: the best achieved rates and the floors."""
    gemm, decode, prefill = tables["gemm"], tables["decode_attention"], tables["prefill_attention"]
    dt = model.dtype_bytes
    m, n, k, t = (pl.col(c) for c in ("m", "n", "k", "latency"))
    b, c = pl.col("batch_size"), pl.col("context")

    def best(frame: pl.DataFrame, expr: pl.Expr) -> float:
        return float(frame.select(expr.max()).item())

    return {
        "mem_bw": best(gemm, (n * k + m * k + m * n) * dt / t),
        "gemm_flops": best(gemm, 2.0 * m * n * k / t),
        "attn_bw": best(decode, b * c * model.kv_bytes_per_token_per_layer / t),
        "attn_flops": best(prefill, 4.0 * model.num_heads * model.head_dim * b * c * (c + 1) / 2 / t),
        "kernel_latency": float(gemm["latency"].min()),  # type: ignore[arg-type]
        "attn_kernel_latency": float(decode["latency"].min()),  # type: ignore[arg-type]
    }


def import_torch(device: str) -> Any:
    """PyTorch, once it is known to run on `device`."""
    try:
        import torch
    except ImportError:
        raise InputError('calibration needs PyTorch: pip install ".[calibrate]"') from None
    if not (device == "cpu" or re.fullmatch(r"cuda(:\d{1,4})?", device)):
        raise InputError(f"--device must be cpu or cuda[:N], got {clip(repr(device))}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: PyTorch sees no CUDA GPU (use --device cpu --model tiny to try it)")
    return torch


def device_name(torch: Any, device: str) -> str:
    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(torch.device(device)))
    return platform.processor() or platform.machine()


def measure_operators(layers: Layers, timer: Timer, grid: Grid, echo: Callable[[str], None]) -> dict[str, pl.DataFrame]:
    """One table per operator family, in the order the profile writes them (no collectives: one device)."""
    echo("operators:")
    tables = {
        "gemm": pl.DataFrame(gemm_rows(layers, timer, grid, echo)),
        "elementwise": pl.DataFrame(elementwise_rows(layers, timer, grid, echo)),
        "collectives": pl.DataFrame(schema={"op": pl.String, "num_gpus": pl.Int64, "message_bytes": pl.Int64,
                                            "latency": pl.Float64}),
    }
    tables["prefill_attention"], tables["decode_attention"] = (
        pl.DataFrame(rows) for rows in attention_rows(layers, timer, grid, echo))
    return tables


def measure_passes(layers: Layers, timer: Timer, grid: Grid, echo: Callable[[str], None]) -> pl.DataFrame:
    """Whole forward passes: the validation set, and last the probe that prices the per-step overhead."""
    echo("whole forward passes:")
    forward = Forward(layers)
    passes = []
    shapes = [("prefill", 1, n, n) for n in grid.validation_prefill] + [
        ("decode", b, 1, c) for b, c in grid.validation_decode]
    for kind, b, n, c in [*shapes, ("probe", grid.probe[0], 1, grid.probe[1])]:
        latency = timer(forward.step(b, n, c))
        passes.append({"kind": kind, "batch_size": b, "new_tokens": n, "context": c, "latency": latency})
        echo(f"  {kind} batch {b}, {n} new tokens, context {c}: {latency * 1e3:.3f} ms")
    return pl.DataFrame(passes)


def profile_meta(out: Path, torch: Any, device: str, name: str, model: ModelSpec,
                 rates: dict[str, float]) -> dict[str, Any]:
    """profile.json's contents, the per-step overhead not yet known (0)."""
    libraries = {"torch": str(torch.__version__)}
    if device.startswith("cuda"):
        libraries["cuda"] = str(torch.version.cuda)
    return {
        "format": FORMAT, "name": out.name, "device": name, "memory_bytes": device_memory(torch, device),
        "datasheet_mem_bw": rates["mem_bw"], "datasheet_flops": rates["gemm_flops"], "dtype": model.dtype,
        "libraries": libraries, "date": datetime.date.today().isoformat(),
        "source": f"measured by calibration/measure.py on {name} ({device}); datasheet rates are the best "
                  "measured ones",
        "step_overhead": 0.0, "model": asdict(model),
        "families": {family: f"measured with PyTorch {torch.__version__} on {device}" for family in TABLE_COLUMNS}
        | {"collectives": "not measured (one device)"},
    }


def write_profile(out: Path, tables: dict[str, pl.DataFrame], passes: pl.DataFrame, meta: dict[str, Any],
                  rates: dict[str, float]) -> None:
    """The profile folder: operator tables, the validation passes (not the probe), roofline.json, profile.json."""
    out.mkdir(parents=True, exist_ok=True)
    for family, frame in tables.items():
        frame.select(TABLE_COLUMNS[family]).write_parquet(out / f"{family}.parquet")
    passes.filter(pl.col("kind") != "probe").write_parquet(out / "validation.parquet")
    roofline = {"name": out.name, "memory_bytes": meta["memory_bytes"], "datasheet_mem_bw": rates["mem_bw"],
                "datasheet_flops": rates["gemm_flops"], **rates, "step_overhead": 0.0, "source": meta["source"]}
    (out / "roofline.json").write_text(json.dumps(roofline, indent=2) + "\n")
    (out / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")


def fit_step_overhead(out: Path, model: ModelSpec, passes: pl.DataFrame, meta: dict[str, Any]) -> None:
    """Set the profile's per-step overhead: what the probe pass takes beyond the sum of its measured
    operators, as the profile just written prices them."""
    probe = passes.filter(pl.col("kind") == "probe").row(0, named=True)
    shape = StepShape.from_rows([(1, probe["context"])] * probe["batch_size"])
    residual = probe["latency"] - MeasuredCost(build_tables(model, load_profile(str(out)))).step_time(shape)
    meta["step_overhead"] = max(residual, 0.0)
    meta["families"]["step_overhead"] = (f"whole decode pass at batch {probe['batch_size']}, context "
                                         f"{probe['context']} minus its operators: {residual * 1e6:.1f} us"
                                         + (" (negative, so 0)" if residual < 0 else ""))
    (out / "profile.json").write_text(json.dumps(meta, indent=2) + "\n")


def calibrate(model_name: str, out: Path, device: str, echo: Callable[[str], None] = click.echo) -> Path:
    """Measure everything, write the profile folder `out`, and return it."""
    check_out_dir(out)  # before minutes of measuring, and never into a folder that holds something
    torch = import_torch(device)
    model = load_model(model_name)
    grid = GPU_GRID if device.startswith("cuda") else CPU_GRID
    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(1)  # one thread: timings that stay put when other work shares the cores
    began = time.perf_counter()
    layers, timer = Layers(torch, model, device), Timer(torch, device, grid)
    name = device_name(torch, device)
    echo(f"calibrating {model.name} ({model.dtype}) on {name}")
    tables = measure_operators(layers, timer, grid, echo)
    passes = measure_passes(layers, timer, grid, echo)
    rates = fit_rates(tables, model)
    meta = profile_meta(out, torch, device, name, model, rates)
    write_profile(out, tables, passes, meta, rates)
    fit_step_overhead(out, model, passes, meta)
    echo(f"per-step overhead {meta['step_overhead'] * 1e6:.1f} us; wrote {out} in {time.perf_counter() - began:.1f} s")
    return out


@click.command("calibrate")
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Built-in name or a local config.json.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Profile folder to write.")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N or cpu.")
def calibrate_command(model: str, out: Path, device: str) -> None:
    """Measure the model's operators on this GPU and write a profile (--gpu PROFILE then uses it)."""
    calibrate(model, out, device)


if __name__ == "__main__":
    calibrate_command()
