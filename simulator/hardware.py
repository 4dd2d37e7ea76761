"""GPU specs: the achieved rates a roofline cost model needs, loaded from profile files.

Hardware is data, not code: each profile is a folder under `calibration/profiles/` whose
`roofline.json` holds the datasheet numbers and the achieved bandwidth, FLOP/s and kernel latency
fitted from measured kernels (see `calibration/fit_roofline.py`, which writes these files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from simulator.errors import InputError

PROFILES_DIR = Path(__file__).resolve().parent.parent / "calibration" / "profiles"


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
    """Per-step time outside the kernels (scheduling, sampling on the host)."""
    source: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "source"):
                continue
            if not isinstance(value, (int, float)) or value < 0 or (value == 0 and f.name != "step_overhead"):
                raise InputError(f"GPU profile {self.name!r}: {f.name} must be positive, got {value!r}")


def available_gpus() -> list[str]:
    return sorted(p.name for p in PROFILES_DIR.iterdir() if (p / "roofline.json").exists())


def load_gpu(name_or_path: str) -> GpuSpec:
    """A shipped profile by name (`h100_sxm`), or a profile folder or `roofline.json` path."""
    path = Path(name_or_path)
    if (PROFILES_DIR / name_or_path / "roofline.json").exists():
        path = PROFILES_DIR / name_or_path / "roofline.json"
    elif path.is_dir():
        path = path / "roofline.json"
    if not path.is_file():
        raise InputError(f"unknown GPU {name_or_path!r}: not a shipped profile ({', '.join(available_gpus())}) "
                         "and no such profile file")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read GPU profile {str(path)!r}: {exc}") from None
    expected = {f.name for f in fields(GpuSpec)}
    missing = sorted(expected - set(data))
    if missing:
        raise InputError(f"GPU profile {str(path)!r} lacks {', '.join(missing)}")
    return GpuSpec(**{key: data[key] for key in expected})
