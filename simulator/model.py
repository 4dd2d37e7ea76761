"""Model specs: the shapes that decide what a forward pass reads and computes.

A spec comes from a Hugging Face `config.json` (a local file, never a download) or a built-in name.
Weight bytes, KV bytes per token and the linear layers' shapes are derived from it, never typed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from simulator.errors import InputError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (Llama family: GQA attention, gated MLP)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    max_model_len: int = 131072
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_model_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPE_BYTES:
            raise InputError(f"model {self.name!r}: unknown dtype {self.dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name!r}: {self.num_heads} heads do not divide into "
                             f"{self.num_kv_heads} KV heads")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def linear_shapes(self) -> tuple[tuple[str, int, int], ...]:
        """Per-layer GEMMs as (name, n, k): output features by input features."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        return (
            ("qkv", q_size + 2 * kv_size, self.hidden_size),
            ("attn_out", self.hidden_size, q_size),
            ("gate_up", 2 * self.intermediate_size, self.hidden_size),
            ("down", self.hidden_size, self.intermediate_size),
        )

    @property
    def num_params(self) -> int:
        per_layer = sum(n * k for _, n, k in self.linear_shapes) + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * per_layer + embeddings + lm_head + self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy in GPU memory."""
        return self.num_params * self.dtype_bytes

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one forward pass reads: everything but the embedding table, which is
        gathered row by row (unless it doubles as the LM head)."""
        if self.tie_word_embeddings:
            return self.weight_bytes
        return self.weight_bytes - self.vocab_size * self.hidden_size * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token across all layers (128 KiB for Llama-3.1-8B in bf16)."""
        return self.num_layers * self.kv_bytes_per_token_per_layer


LLAMA_3_1_8B = ModelSpec(
    name="llama-3.1-8b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    dtype="bfloat16",
    max_model_len=131072,
)

# A model small enough to run layer by layer on a CPU in seconds (calibration tests).
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=1024,
    dtype="float32",
    max_model_len=4096,
)

BUILTIN_MODELS = {spec.name: spec for spec in (LLAMA_3_1_8B, TINY)}


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face `config.json` of a Llama-style model."""
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read model config {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"model config {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(config, dict):
        raise InputError(f"model config {str(path)!r} is not a JSON object")
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in required if key not in config]
    if missing:
        raise InputError(f"model config {str(path)!r} lacks {', '.join(missing)}")
    num_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return ModelSpec(
        name=str(config.get("_name_or_path") or path.parent.name or path.stem),
        num_layers=config["num_hidden_layers"],
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or hidden // num_heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        dtype=dtype,
        max_model_len=config.get("max_position_embeddings", 131072),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name, or a local `config.json` (or a folder holding one)."""
    if name_or_path.lower() in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path.lower()]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise InputError(f"unknown model {name_or_path!r}: not a built-in ({', '.join(BUILTIN_MODELS)}) "
                         "and no such config.json")
    return from_hf_config(path)
