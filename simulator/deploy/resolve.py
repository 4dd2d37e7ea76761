"""A Hugging Face hub id (`Qwen/Qwen3-32B`) resolved to the model servesim prices: found, not listed.

Where a hub id's config.json is looked for, in order:
1. the built-in models, each known by the hub id of the config.json its shapes came from;
2. a models folder (`--models DIR`): `DIR/org--name.config.json` (as `../shared/reference/models/`
   names them, with modelopt's `org--name.hf_quant_config.json` beside) or `DIR/org/name/config.json`;
3. the local Hugging Face cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`,
   as `models--org--name/snapshots/<revision>/config.json` (the newest snapshot).
Matching is case-insensitive. The weights' dtype then comes from the config's own fields
(`quantization_config`, an `hf_quant_config.json` beside it), never from the name.

A variant whose own config is in none of these places (an `-Instruct` or `-FP8` checkpoint of a base
model found there) resolves to the model of the same name once the variant words are dropped: the
naming conventions of fine-tunes and quantized checkpoints (`VARIANT_WORDS`), never a list of model
names; its weights' dtype is then not known from a config, and the caller takes it from what it
measured (a silicon row's quant-mode columns, `--quantization`). An org's first word repeated in the
name (`meta-llama/Meta-Llama-3.1-8B`) and the org itself do not count, so `zhipuai/GLM-5` finds
`zai-org--GLM-5.config.json`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from simulator.deploy.model import BUILTIN_MODELS, load_model
from simulator.errors import InputError, clip

VARIANT_WORDS = frozenset({"instruct", "chat", "base", "hf", "it", "fp8", "dynamic", "fp8dynamic", "bf16"})
"""Words of a checkpoint's name that say how it was tuned or quantized, not which model it is."""
HUB_ID = re.compile(r"Hugging Face (\S+/\S+) config\.json")
"""How a built-in model's `source` names the config.json its shapes came from."""


class ModelNotFound(InputError):
    """No config.json for the hub id in any of the places searched."""


@dataclass(frozen=True)
class Resolved:
    """A hub id's model: `model` as `RunConfig.model` takes it (a built-in name or a config.json path)."""

    hub_id: str
    model: str
    name: str
    """The built-in's name, else the hub id."""
    weight_dtype: str | None
    """From the config's own fields; None: the checkpoint's dtype (or, for a variant, not known)."""
    moe: bool
    variant: bool
    """Found by the base model's name: its dtype is the caller's to say."""
    found: str
    """Where the config was found, in words."""


def core(hub_id: str) -> tuple[str, ...]:
    """The words of a hub id that name the model: the org dropped, and an org word the name repeats,
    and the variant words."""
    org, _, name = hub_id.lower().rpartition("/")
    words = [w for w in re.split(r"[-_\s]+", name) if w]
    if words and org and words[0] == re.split(r"[-_]", org)[0]:
        words = words[1:]
    return tuple(w for w in words if w not in VARIANT_WORDS)


def hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _folder_configs(folder: Path) -> dict[str, Path]:
    """Hub id (lower case) to config path, of a models folder."""
    found: dict[str, Path] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError as exc:
        raise InputError(f"cannot read the models folder {str(folder)!r}: {exc.strerror}") from None
    for entry in entries:
        if entry.name.endswith(".config.json") and "--" in entry.name:
            found[entry.name.removesuffix(".config.json").replace("--", "/", 1).lower()] = entry
        elif entry.is_dir() and not entry.name.startswith("models--"):
            for sub in sorted(entry.iterdir()) if os.access(entry, os.R_OK) else ():
                if (sub / "config.json").is_file():
                    found[f"{entry.name}/{sub.name}".lower()] = sub / "config.json"
    return found


def _cache_configs(cache_dir: Path) -> dict[str, Path]:
    """Hub id (lower case) to the newest snapshot's config.json, of a Hugging Face cache."""
    found: dict[str, Path] = {}
    if not cache_dir.is_dir():
        return found
    for repo in sorted(cache_dir.glob("models--*--*")):
        # A snapshot's files are links into the cache's blobs: one whose blob is gone is no config.
        configs = sorted((p for p in repo.glob("snapshots/*/config.json") if p.is_file()),
                         key=lambda p: p.stat().st_mtime)
        if configs:
            found[repo.name.removeprefix("models--").replace("--", "/", 1).lower()] = configs[-1]
    return found


class ModelResolver:
    """Finds hub ids' configs in the built-ins, `models_dir` and the Hugging Face cache."""

    def __init__(self, models_dir: Path | None = None, cache_dir: Path | None = None) -> None:
        if models_dir is not None and not models_dir.is_dir():
            raise InputError(f"--models {str(models_dir)!r} is not a folder")
        self.places: list[tuple[str, dict[str, str]]] = [
            ("built-in", {m.group(1).lower(): name for name, spec in BUILTIN_MODELS.items()
                          if (m := HUB_ID.search(spec.source))})]
        if models_dir is not None:
            self.places.append((f"--models {models_dir}", {k: str(v) for k, v in _folder_configs(models_dir).items()}))
        cache_dir = hf_cache() if cache_dir is None else cache_dir
        self.found: dict[str, Resolved | InputError] = {}
        self.places.append((f"Hugging Face cache {cache_dir}",
                            {k: str(v) for k, v in _cache_configs(cache_dir).items()}))

    def resolve(self, hub_id: str) -> Resolved:
        """The model of `hub_id`; `ModelNotFound` where no place has it, `InputError` (naming the field)
        where its config is one servesim cannot price. Each id is looked up once."""
        hub_id = hub_id.strip()
        if hub_id not in self.found:
            try:
                self.found[hub_id] = self._resolve(hub_id)
            except InputError as exc:
                self.found[hub_id] = exc
        found = self.found[hub_id]
        if isinstance(found, InputError):
            raise found
        return found

    def resolved(self) -> list[Resolved]:
        """Every id resolved so far, in the order first asked."""
        return [found for found in self.found.values() if isinstance(found, Resolved)]

    def _resolve(self, hub_id: str) -> Resolved:
        wanted = hub_id.lower()
        for place, models in self.places:
            if wanted in models:
                return self._load(hub_id, models[wanted], place, variant=False)
        base = core(hub_id)
        for place, models in self.places:
            for known, model in models.items():
                if base and core(known) == base:
                    return self._load(hub_id, model, f"{place}, as a variant of {known}", variant=True)
        searched = "; ".join(place for place, _ in self.places)
        raise ModelNotFound(f"model {clip(repr(hub_id))} has no config.json (searched: {searched})")

    @staticmethod
    def _load(hub_id: str, model: str, place: str, variant: bool) -> Resolved:
        spec = load_model(model)
        return Resolved(hub_id, model, spec.name if place.startswith("built-in") else hub_id, spec.weight_dtype,
                        spec.is_moe, variant, place)
