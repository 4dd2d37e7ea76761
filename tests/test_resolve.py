"""Hub ids resolved to models from configs found where users keep them, never from a list of names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from simulator.deploy.resolve import ModelNotFound, ModelResolver, core
from simulator.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "shared" / "reference" / "models"
needs_models = pytest.mark.skipif(not MODELS.exists(), reason=f"reference model configs missing: {MODELS}")
EMPTY_CACHE = Path("/nonexistent-hf-cache")


def config(path: Path, **changes: object) -> Path:
    """A small Llama-shaped config.json at `path` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
                                "vocab_size": 1024, "torch_dtype": "bfloat16"} | changes))
    return path


def test_a_built_in_is_found_by_the_hub_id_of_its_config() -> None:
    found = ModelResolver(cache_dir=EMPTY_CACHE).resolve("Qwen/Qwen3-32B")
    assert (found.model, found.name, found.variant) == ("qwen3-32b", "qwen3-32b", False)
    assert ModelResolver(cache_dir=EMPTY_CACHE).resolve("meta-llama/meta-llama-3.1-70b").model == "llama-3.1-70b"


def test_a_variant_without_its_own_config_is_its_base_with_its_dtype_left_open() -> None:
    found = ModelResolver(cache_dir=EMPTY_CACHE).resolve("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert (found.model, found.variant, found.weight_dtype) == ("llama-3.1-8b", True, None)
    assert "as a variant of meta-llama/meta-llama-3.1-8b" in found.found
    # Variant words are dropped, never the words that tell two models apart.
    with pytest.raises(ModelNotFound, match=r"'meta-llama/Llama-3\.1-13B' has no config\.json"):
        ModelResolver(cache_dir=EMPTY_CACHE).resolve("meta-llama/Llama-3.1-13B")
    assert core("zai-org/GLM-5") == core("zhipuai/GLM-5") == ("glm", "5")


@needs_models
def test_a_models_folder_of_either_layout_gives_its_configs(tmp_path: Path) -> None:
    found = ModelResolver(MODELS, EMPTY_CACHE).resolve("Qwen/Qwen3-235B-A22B-FP8")
    assert found.model == str(MODELS / "Qwen--Qwen3-235B-A22B-FP8.config.json")
    assert found.weight_dtype == "fp8_block" and found.moe  # its quantization_config says so
    # modelopt's hf_quant_config.json beside the config says FP8: the weights are fp8 by the file, not the name.
    nested = tmp_path / "models" / "nvidia" / "Llama-3.1-70B-Instruct-FP8"
    nested.mkdir(parents=True)
    shutil.copy(MODELS / "nvidia--Llama-3.1-70B-Instruct-FP8.config.json", nested / "config.json")
    shutil.copy(MODELS / "nvidia--Llama-3.1-70B-Instruct-FP8.hf_quant_config.json", nested / "hf_quant_config.json")
    found = ModelResolver(tmp_path / "models", EMPTY_CACHE).resolve("NVIDIA/llama-3.1-70b-instruct-fp8")
    assert (found.weight_dtype, found.variant) == ("fp8", False)
    (nested / "hf_quant_config.json").unlink()
    unquantized = ModelResolver(tmp_path / "models", EMPTY_CACHE).resolve("nvidia/Llama-3.1-70B-Instruct-FP8")
    assert unquantized.weight_dtype is None


def test_the_hugging_face_cache_is_searched_newest_snapshot_first(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "home" / "hub" / "models--acme--Tiny-1B"
    config(repo / "snapshots" / "aaa" / "config.json", num_hidden_layers=3)
    newest = config(repo / "snapshots" / "bbb" / "config.json", num_hidden_layers=5)
    (repo / "snapshots" / "ccc").mkdir()
    (repo / "snapshots" / "ccc" / "config.json").symlink_to(repo / "blobs" / "gone")  # a blob deleted
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    found = ModelResolver().resolve("acme/Tiny-1B")
    assert found.model == str(newest) and "Hugging Face cache" in found.found
    fp8 = config(tmp_path / "hub" / "models--acme--Tiny-1B-FP8" / "snapshots" / "c" / "config.json",
                 quantization_config={"quant_method": "fp8"})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    found = ModelResolver().resolve("acme/Tiny-1B-FP8")
    assert (found.model, found.weight_dtype, found.variant) == (str(fp8), "fp8", False)


def test_a_config_servesim_cannot_price_names_the_field(tmp_path: Path) -> None:
    config(tmp_path / "acme--Latent-7B.config.json", kv_lora_rank=512)
    with pytest.raises(InputError, match="kv_lora_rank 512 means multi-head latent attention"):
        ModelResolver(tmp_path, EMPTY_CACHE).resolve("acme/Latent-7B")
    with pytest.raises(InputError, match=r"--models '.*nowhere' is not a folder"):
        ModelResolver(tmp_path / "nowhere")
