"""A Hugging Face `config.json` read as untrusted input: every field the model spec is made of is
checked for its type and a physical range, and what servesim cannot price (an architecture, an
attention or MLP variant, a quantization) is refused in one line naming the field and its value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

from simulator.errors import InputError, clip

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "MixtralForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
                           "MiniMaxM2ForCausalLM")
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "n_shared_experts", "first_k_dense_replace")
ALLOWED_FIELDS = {"DeepseekV3ForCausalLM": MLA_FIELDS}
"""Fields of UNSUPPORTED_FIELDS an architecture has and servesim prices for it."""
SLIDING_ARCHITECTURES = ("GptOssForCausalLM",)
"""Architectures whose `layer_types` say which layers attend through a sliding window."""
# Fields that mean attention or MLP servesim cannot price, and the reason; refused when present and not
# switched off (None, False, 0, [] or, for the sparse step, 1).
UNSUPPORTED_FIELDS = {
    "index_topk": "sparse indexer attention (DeepSeek sparse attention)",
    "index_n_heads": "sparse indexer attention (DeepSeek sparse attention)",
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "q_lora_rank": "multi-head latent attention (MLA)",
    "full_attention_interval": "linear attention layers",
    "linear_num_value_heads": "linear attention layers",
    "n_shared_experts": "shared experts",
    "shared_expert_intermediate_size": "shared experts",
    "first_k_dense_replace": "dense layers among the MoE layers",
    "mlp_only_layers": "dense layers among the MoE layers",
}


# The largest value of each size field taken as physical (far past any published model): beyond it a
# field is a typo or a corrupted file, and the sizes derived from it would overflow 64-bit arithmetic.
FIELD_LIMITS = {"num_hidden_layers": 1 << 14, "hidden_size": 1 << 20, "num_attention_heads": 1 << 16,
                "num_key_value_heads": 1 << 16, "head_dim": 1 << 16, "intermediate_size": 1 << 22,
                "moe_intermediate_size": 1 << 22, "vocab_size": 1 << 24, "max_position_embeddings": 1 << 31,
                "num_experts": 1 << 16, "num_local_experts": 1 << 16, "num_experts_per_tok": 1 << 16,
                "n_routed_experts": 1 << 16, "n_shared_experts": 1 << 16, "first_k_dense_replace": 1 << 14,
                "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16, "qk_rope_head_dim": 1 << 16,
                "qk_nope_head_dim": 1 << 16, "v_head_dim": 1 << 16, "sliding_window": 1 << 31,
                "shared_intermediate_size": 1 << 22, "num_nextn_predict_layers": 1 << 14}
QUANT_CONFIG = "hf_quant_config.json"
"""modelopt's quantization file, beside the model's config.json."""
FP8_KEPT = ("gate", "router", "e_score_correction_bias", "lm_head", "embed_tokens")
"""Modules an fp8 checkpoint may leave unquantized (by the last part of their names, besides norms):
the router and its bias, embeddings, LM head (servesim keeps those in the activations' dtype anyway)."""
INT4_KEPT = ("self_attn", "shared_experts")
"""What an int4 checkpoint's `ignore` list must keep out for only routed experts to be int4."""
FP8_BLOCK = [128, 128]
"""The weight block size of the fp8_block kernels measured."""


def shown(value: Any) -> str:
    """A JSON value as a message quotes it: as JSON, at most ~80 characters."""
    return clip(json.dumps(value))


class ConfigFile:
    """A config.json's fields, each read with its type and range checked: one line naming the
    field and the value when it is wrong."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    def fail(self, message: str) -> NoReturn:
        raise InputError(f"model config {str(self.path)!r}: {message}")

    def positive_int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                self.fail(f"lacks {key}")
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            self.fail(f"{key} must be a positive integer, got {shown(value)}")
        if value > FIELD_LIMITS[key]:
            self.fail(f"{key} {shown(value)} is past {FIELD_LIMITS[key]}, more than any model has")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            self.fail(f"{key} must be a string, got {shown(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(f"{key} must be true or false, got {shown(value)}")
        return value

    def architecture(self) -> str:
        """The supported architecture the file names; what servesim cannot price refused first,
        naming the field."""
        architectures = self.data.get("architectures")
        names = architectures if isinstance(architectures, list) else []
        allowed = {field for name in names if isinstance(name, str) for field in ALLOWED_FIELDS.get(name, ())}
        for key, what in UNSUPPORTED_FIELDS.items():
            if key not in allowed and self.data.get(key) not in (None, False, 0, []):
                self.fail(f"{key} {shown(self.data[key])} means {what}, which servesim cannot price")
        if not (isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)):
            if architectures is None and isinstance(self.data.get("quantization"), dict):
                self.fail(f"is modelopt's {QUANT_CONFIG}, not a model's config.json: give the config.json beside it")
            self.fail(f"architectures must be a list of names, got {shown(architectures)}")
        supported = [a for a in architectures if a in SUPPORTED_ARCHITECTURES]
        if not supported:
            self.fail(f"architectures {clip(', '.join(architectures))} is not one servesim can price "
                      f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        if supported[0] not in SLIDING_ARCHITECTURES and self.data.get("sliding_window") is not None \
                and self.data.get("use_sliding_window", True) is not False:
            self.fail(f"sliding_window {shown(self.data['sliding_window'])} means sliding-window attention, "
                      "which servesim cannot price")
        if self.data.get("decoder_sparse_step", 1) != 1:
            self.fail(f"decoder_sparse_step {shown(self.data['decoder_sparse_step'])} means dense layers "
                      "among the MoE layers, which servesim cannot price")
        if self.data.get("moe_layer_freq", 1) != 1:
            self.fail(f"moe_layer_freq {shown(self.data['moe_layer_freq'])} means dense layers among the MoE "
                      "layers, which servesim cannot price")
        if self.text("hidden_act", "silu") != "silu":
            self.fail(f"hidden_act {clip(repr(self.data['hidden_act']))}: servesim prices gated SiLU MLPs only")
        return supported[0]

    def qk_norm_across_heads(self) -> bool:
        """Whether queries and keys are normalized over all heads at once (`qk_norm_type`
        per_layer, with `use_qk_norm`), rather than per head or not at all."""
        kind = self.text("qk_norm_type", "per_head")
        if kind not in ("per_head", "per_layer"):
            self.fail(f"qk_norm_type {shown(kind)} is not per_head or per_layer")
        return self.flag("use_qk_norm", False) and kind == "per_layer"

    def count(self, key: str) -> int:
        """A non-negative integer field (0 when absent)."""
        value = self.data.get(key)
        if value is None or (value == 0 and not isinstance(value, bool)):
            return 0
        return self.positive_int(key)

    def sliding_layers(self, num_layers: int) -> tuple[int, int]:
        """(layers attending through a sliding window, its tokens) from `layer_types`."""
        types = self.data.get("layer_types")
        if types is None:
            return 0, 0
        kinds = ("sliding_attention", "full_attention")
        if not (isinstance(types, list) and len(types) == num_layers and all(t in kinds for t in types)):
            self.fail(f"layer_types must list one of {', '.join(kinds)} for each of the {num_layers} layers, "
                      f"got {shown(types)}")
        sliding = types.count("sliding_attention")
        return sliding, self.positive_int("sliding_window") if sliding else 0

    def weight_dtypes(self, quant: dict[str, Any] | None) -> tuple[str | None, str | None]:
        """(linear layers', routed experts') weight dtypes when the checkpoint is quantized
        (`quantization_config`, or modelopt's hf_quant_config.json): fp8 or fp8 in 128 x 128 blocks
        for both, or 4-bit routed experts (mxfp4; compressed-tensors int4 in groups of 32) beside
        linear layers in the activations' dtype. None: not quantized."""
        config = self.data.get("quantization_config")
        if config is None and quant is None:
            return None, None
        if config is not None:
            if not isinstance(config, dict):
                self.fail(f"quantization_config must be an object, got {shown(config)}")
            method = config.get("quant_method")
            if method == "mxfp4":
                return None, "mxfp4"
            if method == "compressed-tensors":
                return None, self._int4_experts(config)
            if method != "fp8":
                self.fail(f"quantization_config.quant_method {shown(method)}: servesim prices fp8, mxfp4 and "
                          "compressed-tensors int4 only")
            kept = config.get("modules_to_not_convert", [])
            if not (isinstance(kept, list) and all(isinstance(m, str) and (m.rpartition(".")[2] in FP8_KEPT
                                                                        or m.endswith("norm")) for m in kept)):
                self.fail(f"quantization_config.modules_to_not_convert {shown(kept)}: servesim keeps only "
                          f"norms, {', '.join(FP8_KEPT)} out of fp8")
            block = config.get("weight_block_size")
            if block is None:
                return "fp8", None
            if block != FP8_BLOCK or not all(isinstance(side, int) for side in block):
                self.fail(f"quantization_config.weight_block_size {shown(block)}: servesim prices fp8 blocks of "
                          f"{FP8_BLOCK[0]} x {FP8_BLOCK[1]} only")
            return "fp8_block", None
        assert quant is not None
        algo = quant.get("quantization", {}).get("quant_algo") if isinstance(quant.get("quantization"), dict) else None
        if algo != "FP8":
            self.fail(f"{QUANT_CONFIG} quant_algo {shown(algo)}: servesim prices FP8 only")
        return "fp8", None

    def _int4_experts(self, config: dict[str, Any]) -> str:
        """compressed-tensors as Kimi-K2.5 ships it: int4 weights in groups of 32, activations not
        quantized, attention and shared experts (and dense MLPs) left out, so only routed experts."""
        groups = config.get("config_groups")
        group = next(iter(groups.values())) if isinstance(groups, dict) and len(groups) == 1 else None
        weights = group.get("weights") if isinstance(group, dict) else None
        wanted = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}
        if not (isinstance(weights, dict) and all(weights.get(k) == v for k, v in wanted.items())
                and group.get("input_activations") is None):  # type: ignore[union-attr]
            self.fail(f"quantization_config.config_groups {shown(groups)}: servesim prices compressed-tensors "
                      "int4 weights in groups of 32 (activations unquantized) only")
        ignore = config.get("ignore")
        if not (isinstance(ignore, list) and all(isinstance(i, str) for i in ignore)
                and all(any(part in i for i in ignore) for part in INT4_KEPT)):
            self.fail(f"quantization_config.ignore {shown(ignore)}: servesim prices int4 routed experts only "
                      f"(attention and shared experts kept out: {', '.join(INT4_KEPT)})")
        return "int4"


MAX_JSON_BYTES = 1 << 24
"""The largest settings file read (a config.json or a profile's is kilobytes): past it, a wrong file."""


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A settings file's JSON object; a path that is no regular file (a FIFO would block the read)
    or a file past MAX_JSON_BYTES is refused."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
            raise InputError(f"{what} {str(path)!r} is not a file of JSON settings (a regular file of at most "
                             f"{MAX_JSON_BYTES >> 20} MiB)")
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{what} {str(path)!r} is not valid JSON: {clip(str(exc))}") from None
    if not isinstance(data, dict):
        raise InputError(f"{what} {str(path)!r} is not a JSON object")
    return data


def quant_config_beside(path: Path) -> Path | None:
    """modelopt's quantization file of the model config at `path`: `hf_quant_config.json` beside a
    `config.json`, `NAME.hf_quant_config.json` beside `NAME.config.json` (as the reference models are
    named); a config saved under any other name has none."""
    if path.name == "config.json":
        return path.with_name(QUANT_CONFIG)
    if path.name.endswith(".config.json"):
        return path.with_name(path.name.removesuffix("config.json") + QUANT_CONFIG)
    return None
