"""Every file servesim reads, read as untrusted input: a model's config.json, measured results and GPU
profiles. Each bad field is refused in one line that names the file, the field (and the 1-based line
or row a person would see in an editor) and at most ~80 characters of the value."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.deploy.model import LLAMA_3_1_8B, load_model
from simulator.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
LLAMA_FILE = MODELS / "meta-llama--Meta-Llama-3.1-8B.config.json"
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")


def refused(*fragments: str) -> pytest.RaisesContext[InputError]:
    """Expect an InputError whose one-line message holds every fragment."""
    wanted = "".join(f"(?=.*{re.escape(fragment)})" for fragment in fragments)
    return pytest.raises(InputError, match=rf"(?s)\A{wanted}[^\n]*\Z")


# ---------------------------------------------------------------- model config.json


@needs_models
def test_a_config_under_any_name_is_the_model(tmp_path: Path) -> None:
    """A byte-for-byte copy of the shipped Llama-3.1-8B config saved as llama8b.json is Llama-3.1-8B
    (it was read as its own hf_quant_config.json and refused as "quant_algo null")."""
    copy = tmp_path / "llama8b.json"
    copy.write_bytes(LLAMA_FILE.read_bytes())
    spec = load_model(str(copy))
    assert replace(spec, name=LLAMA_3_1_8B.name) == LLAMA_3_1_8B and spec.weight_dtype is None
    assert spec.name == "llama8b"


@needs_models
def test_a_config_under_any_name_gets_its_own_problem(tmp_path: Path) -> None:
    data = json.loads(LLAMA_FILE.read_text()) | {"num_key_value_heads": 7}
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with refused("32 heads do not divide into 7 KV heads"):
        load_model(str(path))


@needs_models
def test_a_quantization_file_beside_a_config_json_is_its_own_only(tmp_path: Path) -> None:
    """hf_quant_config.json is read beside config.json (and NAME.hf_quant_config.json beside
    NAME.config.json), never beside a config saved under another name."""
    quant = (MODELS / "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json").read_bytes()
    (tmp_path / "hf_quant_config.json").write_bytes(quant)
    (tmp_path / "config.json").write_bytes(LLAMA_FILE.read_bytes())
    (tmp_path / "other.json").write_bytes(LLAMA_FILE.read_bytes())
    assert load_model(str(tmp_path)).weight_dtype == "fp8"
    assert load_model(str(tmp_path / "other.json")).weight_dtype is None
    with refused("hf_quant_config.json", "is modelopt's hf_quant_config.json, not a model's config.json"):
        load_model(str(tmp_path / "hf_quant_config.json"))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_hidden_layers", 10**30, "num_hidden_layers 1000000000000000000000000000000 is past 16384"),
    ("vocab_size", 2**63, "vocab_size 9223372036854775808 is past 16777216"),
    ("hidden_size", float("nan"), "hidden_size must be a positive integer, got NaN"),
    ("head_dim", float("inf"), "head_dim must be a positive integer, got Infinity"),
    ("torch_dtype", "x" * 10_000, "torch_dtype 'xxxxxxx"),
    ("hidden_act", "\u00e9" * 500, "hidden_act '\u00e9\u00e9\u00e9"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": [64, 64]},
     "weight_block_size [64, 64]: servesim prices fp8 blocks of 128 x 128 only"),
    ("quantization_config", {"quant_method": "fp8", "weight_block_size": "128"}, 'weight_block_size "128"'),
])
def test_config_values_are_range_checked_and_quoted_short(field: str, value: object, message: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    data = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    path.write_text(json.dumps(data | {field: value}))
    with pytest.raises(InputError) as error:
        load_model(str(path))
    assert message in str(error.value) and str(path) in str(error.value)
    assert len(str(error.value)) < 80 + 200 and "\n" not in str(error.value)


def test_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with refused("config.json", "is not valid JSON"):
        load_model(str(path))
