"""Model specs: derived sizes against the published architecture of Llama-3.1-8B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.model import LLAMA_3_1_8B, load_model

# Llama-3.1-8B's config.json as published by Meta on Hugging Face (the fields servesim reads).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "torch_dtype": "bfloat16", "vocab_size": 128256, "tie_word_embeddings": False,
}


def test_llama_derived_sizes() -> None:
    assert LLAMA_3_1_8B.kv_bytes_per_token == 128 * 1024
    assert LLAMA_3_1_8B.num_params == pytest.approx(8.03e9, rel=1e-3)  # "8B": 8,030,261,248
    assert LLAMA_3_1_8B.weight_bytes == 2 * LLAMA_3_1_8B.num_params


def test_hf_config_gives_the_same_spec(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_CONFIG))
    spec = load_model(str(tmp_path))
    assert spec.num_params == LLAMA_3_1_8B.num_params
    assert spec.kv_bytes_per_token == LLAMA_3_1_8B.kv_bytes_per_token
    assert spec.linear_shapes == LLAMA_3_1_8B.linear_shapes


def test_bad_configs_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown model 'nope'"):
        load_model("nope")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(str(bad))
    bad.write_text(json.dumps({k: v for k, v in LLAMA_CONFIG.items() if k != "hidden_size"}))
    with pytest.raises(InputError, match="lacks hidden_size"):
        load_model(str(bad))
