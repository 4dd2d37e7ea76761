"""Cost models: how long one forward pass takes, given what the batch computes.

`contract` says what a cost model offers; `operators` lists the kernels of a forward pass once for
both models; `RooflineCost` (`roofline`) prices them by bytes and FLOPs alone, for hardware never
measured op by op; `MeasuredCost` (`measured`) sums measured kernel times from a GPU profile,
interpolated (`curves`, `gemm`, `moe`); `parallel` prices tensor parallelism's all-reduces.
`build_cost_model` picks one for a run.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from simulator.cost.contract import CostModel, StepShape, causal_pairs
from simulator.cost.curves import BatchCurves, Curve
from simulator.cost.operators import elementwise_ops
from simulator.cost.parallel import AllReduce, all_reduce_table
from simulator.cost.roofline import RooflineCost
from simulator.cost.speculative import SpeculativeCost
from simulator.deploy.hardware import GpuSpec, load_profile, profile_dir
from simulator.deploy.model import ModelSpec, draft_model
from simulator.deploy.spec import check_data_parallel

if TYPE_CHECKING:
    from simulator.cost.gemm import GemmTable, attention_rows
    from simulator.cost.measured import MeasuredCost, MeasuredTables, build_tables, measured_cost
    from simulator.cost.moe import MoeTable

# The measured model's modules (and polars, which reads its tables) load on first use: a roofline run
# never needs them.
LAZY = {"GemmTable": "gemm", "attention_rows": "gemm", "MeasuredCost": "measured", "MeasuredTables": "measured",
        "build_tables": "measured", "measured_cost": "measured", "MoeTable": "moe"}

COST_MODELS = ("measured", "roofline")
__all__ = ["COST_MODELS", "AllReduce", "BatchCurves", "CostModel", "CostSettings", "Curve", "GemmTable",
           "MeasuredCost", "MeasuredTables", "MoeTable", "RooflineCost", "SpeculativeCost", "StepShape",
           "attention_rows", "build_cost_model",
           "build_tables", "causal_pairs", "elementwise_ops", "measured_cost"]


class CostSettings(Protocol):
    """The run settings a cost model is built from (`simulator.config.RunConfig` has them)."""

    @property
    def cost(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def quantization(self) -> str | None: ...
    @property
    def kv_cache_dtype(self) -> str: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def data_parallel_size(self) -> int: ...
    @property
    def enable_expert_parallel(self) -> bool: ...
    @property
    def num_replicas(self) -> int: ...
    @property
    def speculative_method(self) -> str | None: ...
    @property
    def num_speculative_tokens(self) -> int | None: ...
    @property
    def draft_model(self) -> str | None: ...
    @property
    def disable_custom_all_reduce(self) -> bool: ...


def build_cost_model(config: CostSettings, model: ModelSpec, gpu: GpuSpec) -> CostModel:
    """The cost model a run asks for, for one GPU of `model` in the run's dtypes and parallelism:
    measured kernels from its profile, or the roofline (all-reduces measured where the profile has
    collectives); under speculative decoding, with its drafter's passes (`SpeculativeCost`)."""
    target = _cost_model(config, model, gpu)
    if config.speculative_method is None or not config.num_speculative_tokens:  # k = 0 drafts nothing
        return target
    drafter = draft_model(config.speculative_method, model, config.draft_model)
    draft = None
    if drafter is not None:  # its passes run inside the step: no host overhead of their own
        quiet = replace(gpu, step_overhead=0.0, per_sequence_overhead=0.0, per_token_overhead=0.0)
        draft = _cost_model(config, drafter, quiet)
        if config.cost == "measured":
            from simulator.cost.measured import MeasuredCost

            assert isinstance(draft, MeasuredCost)
            draft = MeasuredCost(replace(draft.tables, gpu=quiet, step_overhead=0.0))
    return SpeculativeCost(target, draft, config.num_speculative_tokens)


def _cost_model(config: CostSettings, model: ModelSpec, gpu: GpuSpec) -> CostModel:
    deployed = model.deployed(config.quantization, config.kv_cache_dtype)
    tp, dp = config.tensor_parallel_size, config.data_parallel_size
    check_data_parallel(dp, config.enable_expert_parallel, config.num_replicas)
    ep = model.expert_parallel_size(tp, dp, config.enable_expert_parallel)
    if config.cost == "roofline":
        all_reduce = None
        if tp > 1 and (profile_dir(config.gpu) / "profile.json").exists():
            all_reduce = AllReduce(tp, gpu, all_reduce_table(load_profile(config.gpu),
                                                             config.disable_custom_all_reduce))
        return RooflineCost(deployed, gpu, tp, all_reduce, ep, dp)
    from simulator.cost.measured import measured_cost

    return measured_cost(deployed, config.gpu, tp, ep, dp, config.disable_custom_all_reduce)


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(f"simulator.cost.{LAZY[name]}"), name)
    raise AttributeError(f"module 'simulator.cost' has no attribute {name!r}")
