"""GPU profiles: measured kernel tables and the roofline constants, loaded from profile folders.

Hardware is data, not code: each profile is a folder under `calibration/profiles/` (or anywhere,
given by path) in the format `calibration/README.md` documents: `profile.json` (metadata and
provenance), one Parquet table per operator family, and `roofline.json` with the achieved
bandwidth, FLOP/s and kernel latency fitted from the kernels (`calibration/fit_roofline.py`).
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import polars as pl

from simulator.errors import InputError

PROFILES_DIR = Path(__file__).resolve().parents[2] / "calibration" / "profiles"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as the roofline sees it. Rates in bytes/s and FLOP/s, times in seconds."""

    name: str
    memory_bytes: int
    datasheet_mem_bw: float
    datasheet_flops: float
    mem_bw: float
    """Achieved bandwidth streaming GEMM weights (decode-sized GEMMs)."""
    attn_bw: float
    """Achieved bandwidth reading KV cache in decode attention."""
    gemm_flops: float
    """Achieved FLOP/s of large bf16 GEMMs."""
    attn_flops: float
    """Achieved FLOP/s of long-prompt prefill attention."""
    kernel_latency: float
    """Fixed time of one small kernel (GEMM, elementwise)."""
    attn_kernel_latency: float
    """Fixed time of one attention kernel launch."""
    step_overhead: float
    """Host time per step outside the kernels (scheduling, input preparation, launch gaps)."""
    source: str
    per_sequence_overhead: float = 0.0
    """Host time per sequence in the step (sampling, detokenisation, output processing)."""
    per_token_overhead: float = 0.0
    """Host time per token computed in the step (input preparation that scales with tokens)."""
    fp8_gemm_flops: float | None = None
    """Achieved FLOP/s of large fp8 GEMMs (None: fp8 weights cannot be priced by roofline)."""
    fp8_mem_bw: float | None = None
    """Achieved bandwidth streaming fp8 GEMM weights."""
    interconnect_bw: float | None = None
    """Per-GPU bandwidth between GPUs of a node, one direction (NVLink), bytes/s."""
    interconnect_latency: float = 0.0
    """Fixed time of one collective beyond the measured ones."""

    def __post_init__(self) -> None:
        may_be_zero = ("step_overhead", "per_sequence_overhead", "per_token_overhead", "interconnect_latency")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "source") or (value is None and f.default is None):
                continue
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0
                    or (value == 0 and f.name not in may_be_zero)):
                raise InputError(f"GPU profile {self.name!r}: {f.name} must be positive, got {value!r}")


def available_gpus() -> list[str]:
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "roofline.json").exists())


def profile_dir(name_or_path: str) -> Path:
    """The folder of a shipped profile by name (`h100_sxm`), or of a profile folder or file path."""
    if (PROFILES_DIR / name_or_path / "roofline.json").exists():
        return PROFILES_DIR / name_or_path
    path = Path(name_or_path)
    folder = path if path.is_dir() else path.parent
    if path.exists() and not (folder / "roofline.json").is_file():
        raise InputError(f"--gpu {name_or_path!r} is not a GPU profile: {str(folder)!r} has no roofline.json "
                         "(the format is in calibration/README.md)")
    if not path.exists():
        raise InputError(f"unknown GPU {name_or_path!r}: not a shipped profile ({', '.join(available_gpus())}) "
                         "and no such profile folder")
    return folder


def load_gpu(name_or_path: str) -> GpuSpec:
    """The roofline constants of a shipped profile by name, or of a profile folder or file path."""
    path = profile_dir(name_or_path) / "roofline.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read GPU profile {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"GPU profile {str(path)!r} is not a JSON object")
    required = {f.name for f in fields(GpuSpec) if f.default is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise InputError(f"GPU profile {str(path)!r} lacks {', '.join(missing)}")
    return GpuSpec(**{f.name: data[f.name] for f in fields(GpuSpec) if f.name in data})


# Operator families and the columns each table must have. Latencies are seconds, sizes bytes/tokens.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "latency"),
    "prefill_attention": ("batch_size", "new_tokens", "context", "num_heads", "num_kv_heads", "head_dim", "latency"),
    "decode_attention": ("batch_size", "context", "num_heads", "num_kv_heads", "head_dim", "latency"),
    "elementwise": ("op", "tokens", "bytes", "latency"),
    "collectives": ("op", "num_gpus", "message_bytes", "latency"),
}
# Tables a profile may have: fp8 GEMMs (per-tensor and 128 x 128 block scales), attention over an fp8
# KV cache, and fused mixture-of-experts kernels (`inter_size` is each GPU's share of an expert).
OPTIONAL_TABLES: dict[str, tuple[str, ...]] = {
    "gemm_fp8": TABLE_COLUMNS["gemm"],
    "gemm_fp8_block": TABLE_COLUMNS["gemm"],
    "prefill_attention_fp8": TABLE_COLUMNS["prefill_attention"],
    "decode_attention_fp8": TABLE_COLUMNS["decode_attention"],
    "moe": ("dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "latency"),
}
VALIDATION_COLUMNS = ("kind", "batch_size", "new_tokens", "context", "latency")
META_KEYS = ("format", "name", "device", "memory_bytes", "datasheet_mem_bw", "datasheet_flops", "dtype", "libraries",
             "date", "source", "step_overhead", "families")


@dataclass(frozen=True, eq=False)
class Profile:
    """One GPU's measured operator tables, their provenance, and its roofline constants."""

    path: Path
    meta: dict[str, Any]
    gpu: GpuSpec
    tables: dict[str, pl.DataFrame]
    validation: pl.DataFrame | None
    """Whole forward passes measured by the calibration script (absent in reference-built profiles)."""

    @property
    def step_overhead(self) -> float:
        return float(self.meta["step_overhead"])


def _read_table(path: Path, columns: tuple[str, ...]) -> pl.DataFrame:
    try:
        table = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise InputError(f"cannot read profile table {str(path)!r}: {exc}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"profile table {str(path)!r} lacks {', '.join(missing)}")
    if table.height and not table["latency"].min() > 0:  # type: ignore[operator]
        raise InputError(f"profile table {str(path)!r} has a latency <= 0")
    return table.select(columns)


def load_profile(name_or_path: str) -> Profile:
    """A whole profile: metadata, one table per operator family, optional validation passes."""
    folder = profile_dir(name_or_path)
    return _load_profile(folder.resolve(), (folder / "profile.json").stat().st_mtime_ns
                         if (folder / "profile.json").exists() else 0)


@lru_cache(maxsize=16)
def _load_profile(folder: Path, _mtime: int) -> Profile:
    meta_path = folder / "profile.json"
    if not meta_path.is_file():
        raise InputError(f"profile {str(folder)!r} has no profile.json (only a roofline): use --cost roofline")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {str(meta_path)!r}: {exc}") from None
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise InputError(f"{str(meta_path)!r} lacks {', '.join(missing)}")
    if not (isinstance(meta["step_overhead"], (int, float)) and meta["step_overhead"] >= 0):
        raise InputError(f"{str(meta_path)!r}: step_overhead must be >= 0 seconds, got {meta['step_overhead']!r}")
    tables = {family: _read_table(folder / f"{family}.parquet", columns) for family, columns in TABLE_COLUMNS.items()}
    tables |= {family: _read_table(folder / f"{family}.parquet", columns)
               for family, columns in OPTIONAL_TABLES.items() if (folder / f"{family}.parquet").exists()}
    validation_path = folder / "validation.parquet"
    validation = _read_table(validation_path, VALIDATION_COLUMNS) if validation_path.exists() else None
    return Profile(folder, meta, load_gpu(str(folder)), tables, validation)
