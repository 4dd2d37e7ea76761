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
from typing import TYPE_CHECKING, Any

from simulator.deploy.hf_config import read_json
from simulator.deploy.model import DTYPE_BYTES, ModelSpec
from simulator.errors import InputError, clip

if TYPE_CHECKING:
    import polars as pl

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
    host_link_bw: float | None = None
    """Bandwidth between the GPU and host memory, one direction (PCIe), bytes/s: the KV host tier's
    loads (`--kv-offload-bandwidth`)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "source"):
                if not isinstance(value, str):
                    raise InputError(f"GPU profile: {f.name} must be a string, got {clip(repr(value))}")
            elif not (value is None and f.default is None):
                check_range(value, f.name, f"GPU profile {self.name!r}")


# Each number's physical range, (least, most): far past any GPU's, so that a value outside is a
# typo, a unit mistaken or a corrupted file. A least of 0 is excluded but for the times that may be 0.
# Rates divide work into time: a megabyte or a million FLOPs a second is already a GPU no one has
# (1e-300 overflowed the step times).
BYTES_PER_S, FLOPS, SECONDS = (1e6, 1e15), (1e6, 1e18), (0.0, 1.0)
RANGES: dict[str, tuple[float, float]] = {
    "memory_bytes": (2**20, 2**50), "datasheet_mem_bw": BYTES_PER_S, "datasheet_flops": FLOPS,
    "mem_bw": BYTES_PER_S, "attn_bw": BYTES_PER_S, "fp8_mem_bw": BYTES_PER_S, "interconnect_bw": BYTES_PER_S,
    "host_link_bw": BYTES_PER_S,
    "gemm_flops": FLOPS, "attn_flops": FLOPS, "fp8_gemm_flops": FLOPS, "kernel_latency": SECONDS,
    "attn_kernel_latency": SECONDS, "step_overhead": SECONDS, "per_sequence_overhead": SECONDS,
    "per_token_overhead": SECONDS, "interconnect_latency": SECONDS, "client_time": SECONDS,
}
MAY_BE_ZERO = ("step_overhead", "per_sequence_overhead", "per_token_overhead", "interconnect_latency", "client_time")


def check_range(value: Any, name: str, where: str) -> float:
    """`value` as a number within `name`'s physical range, or refused naming `where` it is."""
    least, most = RANGES[name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and least <= value <= most and (value > 0 or name in MAY_BE_ZERO)):
        low = "[0" if name in MAY_BE_ZERO else f"({least:g}" if least == 0 else f"[{least:g}"
        raise InputError(f"{where}: {name} must be a number in {low}, {most:g}], got {clip(repr(value))}")
    return float(value)


def available_gpus() -> list[str]:
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "roofline.json").exists())


def profile_dir(name_or_path: str) -> Path:
    """The folder of a shipped profile by name (`h100_sxm`), or of a profile folder or file path."""
    try:
        if (PROFILES_DIR / name_or_path / "roofline.json").exists():
            return PROFILES_DIR / name_or_path
        path = Path(name_or_path)
        folder = path if path.is_dir() else path.parent
        found = path.exists()
        if found and not (folder / "roofline.json").is_file():
            raise InputError(f"--gpu {clip(repr(name_or_path))} is not a GPU profile: {str(folder)!r} has no "
                             "roofline.json (the format is in calibration/README.md)")
    except (OSError, ValueError) as exc:  # a name too long for a path, or holding a NUL
        if isinstance(exc, InputError):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)  # no path quoted whole
        raise InputError(f"unknown GPU {clip(repr(name_or_path))}: {clip(reason)}") from None
    if not found:
        raise InputError(f"unknown GPU {clip(repr(name_or_path))}: not a shipped profile "
                         f"({', '.join(available_gpus())}) and no such profile folder")
    return folder


def load_gpu(name_or_path: str) -> GpuSpec:
    """The roofline constants of a shipped profile by name, or of a profile folder or file path."""
    path = profile_dir(name_or_path) / "roofline.json"
    data = read_json(path, "GPU profile")
    required = {f.name for f in fields(GpuSpec) if f.default is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise InputError(f"GPU profile {str(path)!r} lacks {', '.join(missing)}")
    try:
        return GpuSpec(**{f.name: data[f.name] for f in fields(GpuSpec) if f.name in data})
    except InputError as exc:
        raise InputError(f"{exc} (in {str(path)!r})") from None


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
    # NCCL's all-reduce at every size, for a server whose custom all-reduce is off.
    "collectives_nccl": TABLE_COLUMNS["collectives"],
    # Issue 25's models (calibration/kernel_db_models.py): MLA kernels by KV dtype and heads per GPU,
    # 4-bit and expert-parallel fused MoE, DeepEP's dispatch and combine (`op`) by tokens per GPU.
    "mla_decode_attention": ("dtype", "batch_size", "context", "num_heads", "latency"),
    "mla_prefill_attention": ("dtype", "batch_size", "new_tokens", "context", "num_heads", "latency"),
    "moe_quant": ("dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "expert_parallel",
                  "latency"),
    # Sliding-window attention kernels (gpt-oss's windowed layers), `window` tokens.
    **{f"{family}_window{kv}": (*TABLE_COLUMNS[family][:-1], "window", "latency")
       for family in ("prefill_attention", "decode_attention") for kv in ("", "_fp8")},
    "all_to_all": ("op", "num_tokens", "hidden_size", "topk", "num_experts", "latency"),
}
VALIDATION_COLUMNS = ("kind", "batch_size", "new_tokens", "context", "latency")
META_KEYS = ("format", "name", "device", "memory_bytes", "datasheet_mem_bw", "datasheet_flops", "dtype", "libraries",
             "date", "source", "step_overhead", "families")
META_TYPES: dict[str, type] = {"format": int, "name": str, "device": str, "dtype": str, "libraries": dict, "date": str,
                               "source": str, "families": dict}
NUMBER = (int, float)
FIT_TERMS = ("step_overhead", "per_sequence_overhead", "per_token_overhead", "client_time")
FIT_SHAPE = {
    "values": dict.fromkeys(FIT_TERMS, NUMBER), "units": dict.fromkeys(FIT_TERMS, str),
    "fitted_on": {"files": [str], "points": int, "weights": str, "tensor_parallel_sizes": (list, str),
                  "statistics": [str]},
    "median_abs_error": {"*": {"*": NUMBER}},
    "residuals": [{"point": str, "tensor_parallel_size": int, "statistic": str, "measured": NUMBER,
                   "simulated": NUMBER, "error": NUMBER, "held_out": bool}],
}
"""The host-overhead fit `simulate fit` records in profile.json (its rounds' profiles hold the values
only), as JSON types: an object's fields (`"*"`: its every field), a list's items, or the types a
value may have."""


def has_shape(value: Any, shape: Any) -> bool:
    """Whether JSON `value` is of `shape` (as FIT_SHAPE writes one); true or false is no number."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return False
        if "*" in shape:
            return all(has_shape(item, shape["*"]) for item in value.values())
        return all(key in value and has_shape(value[key], part) for key, part in shape.items())
    if isinstance(shape, list):
        return isinstance(value, list) and all(has_shape(item, shape[0]) for item in value)
    return isinstance(value, shape) and (shape is bool or not isinstance(value, bool))


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


TEXT_COLUMNS = ("op", "dtype", "kind")
MAX_SIZE = 2**50
"""The largest size a table may hold (bytes, tokens, a batch): past any GPU's memory."""
MIN_LATENCY, MAX_LATENCY = 1e-9, 3600.0
"""The shortest and longest kernel or pass a table may hold, seconds (no kernel ends within a
nanosecond of its launch)."""


def _read_table(path: Path, columns: tuple[str, ...]) -> pl.DataFrame:
    """A profile table's columns, each of its type (text, a latency in seconds, an integer size),
    without gaps and in its range; a bad value is refused naming its 1-based row."""
    import polars as pl

    try:
        table = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise InputError(f"cannot read profile table {str(path)!r}: {clip(str(exc))}") from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"profile table {str(path)!r} lacks {', '.join(missing)}")
    table = table.select(columns)
    for name in columns:
        _check_column(table[name], path)
    return table


def _check_column(column: pl.Series, path: Path) -> None:
    import polars as pl

    name = column.name
    if name in TEXT_COLUMNS:
        expected, fits = "text", column.dtype == pl.String
    elif name == "latency":
        expected, fits = f"seconds in [{MIN_LATENCY:g}, {MAX_LATENCY:g}]", column.dtype.is_numeric()
    else:
        expected, fits = "integers in [0, 2**50]", column.dtype.is_integer()
    if not fits:
        raise InputError(f"profile table {str(path)!r}: column {name} has type {column.dtype}; expected {expected}")
    if name in TEXT_COLUMNS:
        inside = column.is_not_null()
    elif name == "latency":
        inside = column.cast(pl.Float64).is_between(MIN_LATENCY, MAX_LATENCY)  # NaN sorts above all
    else:
        inside = column.cast(pl.Float64).is_between(0, MAX_SIZE)
    rows = (~inside.fill_null(False)).arg_true()
    if rows.len():
        raise InputError(f"profile table {str(path)!r}: row {rows[0] + 1} has {name} {clip(repr(column[rows[0]]))}; "
                         f"expected {expected}")


def _check_meta(meta: dict[str, Any], path: Path) -> None:
    """profile.json's fields: each present, of its type, the numbers in their physical ranges; the
    model its passes were measured on, if any, a whole one; the host-overhead fit, if any, whole."""
    where = f"{str(path)!r}"
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise InputError(f"{where} lacks {', '.join(missing)}")
    for key, kind in META_TYPES.items():
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise InputError(f"{where}: {key} must be a JSON {kind.__name__}, got {clip(json.dumps(meta[key]))}")
    for key in ("memory_bytes", "datasheet_mem_bw", "datasheet_flops", "step_overhead"):
        check_range(meta[key], key, where)
    if meta["dtype"] not in DTYPE_BYTES:
        raise InputError(f"{where}: dtype {clip(repr(meta['dtype']))} is not one of {', '.join(DTYPE_BYTES)}")
    model = meta.get("model")
    if model is not None:
        known = {f.name for f in fields(ModelSpec)}
        if not isinstance(model, dict):
            raise InputError(f"{where}: model must be an object of ModelSpec's fields, got {clip(json.dumps(model))}")
        if not set(model) <= known:  # the unknown fields named, not the 17 known: the line stays short
            raise InputError(f"{where}: model must be an object of ModelSpec's fields, not "
                             f"{clip(', '.join(map(repr, sorted(set(model) - known))))}")
        try:
            ModelSpec(**model)
        except (TypeError, InputError) as exc:  # TypeError: a field it must have is missing
            raise InputError(f"{where}: model {clip(str(exc))}") from None
    fit = meta.get("host_overhead_fit")
    if fit is not None:  # runs read its values; `simulate validate` shows the rest when it is whole
        if not (isinstance(fit, dict) and has_shape(fit.get("values"), FIT_SHAPE["values"])):
            raise InputError(f"{where}: host_overhead_fit must hold values of {', '.join(FIT_TERMS)}, as `simulate "
                             f"fit` writes it, got {clip(json.dumps(fit))}")
        for term in FIT_TERMS:
            check_range(fit["values"][term], term, f"{where}: host_overhead_fit.values")


def _check_physics(path: Path, family: str, table: pl.DataFrame, bf16_flops: float) -> None:
    """Refuse a table with a row that computes faster than the GPU's datasheet allows
    (`simulator.deploy.physics`, with its `LOAD_ALLOWANCE`), naming the first such row."""
    from simulator.deploy.physics import CHECKED, LOAD_ALLOWANCE, too_fast

    fast = too_fast(family, table, bf16_flops, LOAD_ALLOWANCE)
    if fast.height:
        first = fast.row(0, named=True)
        raise InputError(f"profile table {str(path)!r}: row {first['row'] + 1} ({first['latency']:.3g} s) computes "
                         f"{first['share']:.3g}x the GPU's {CHECKED[family] * bf16_flops / 1e12:.4g} TFLOP/s datasheet "
                         f"rate (profile.json datasheet_flops; {LOAD_ALLOWANCE:g}x at most): a measurement gone wrong")


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
    meta = read_json(meta_path, "profile")
    _check_meta(meta, meta_path)
    tables = {family: _read_table(folder / f"{family}.parquet", columns) for family, columns in TABLE_COLUMNS.items()}
    tables |= {family: _read_table(folder / f"{family}.parquet", columns)
               for family, columns in OPTIONAL_TABLES.items() if (folder / f"{family}.parquet").exists()}
    if not folder.is_relative_to(PROFILES_DIR.resolve()):  # the shipped ones: tests/test_profile_physics.py
        for family, table in tables.items():
            _check_physics(folder / f"{family}.parquet", family, table, float(meta["datasheet_flops"]))
    validation_path = folder / "validation.parquet"
    validation = _read_table(validation_path, VALIDATION_COLUMNS) if validation_path.exists() else None
    return Profile(folder, meta, load_gpu(str(folder)), tables, validation)
