"""Serving stacks as profiles: each stack's scheduler semantics and defaults, and its kernel tables.

`--backend vllm|sglang|trtllm` picks a stack: its GPU profile (`<gpu>_<stack>`, built from that
stack's measured kernels by `calibration/build_reference.py`) and the scheduler settings a stock
server of that stack starts with on an H100/H200-class GPU, where the user gave none. What each
default is and where its source says so:

- vLLM 0.19 (V1 engine): chunked prefill always on, one token budget per step shared by decodes and
  prefill chunks: `max_num_batched_tokens` 8192 and `max_num_seqs` 1024 for the OpenAI server on a
  GPU of >= 70 GiB (vllm/engine/arg_utils.py, `EngineArgs._set_default_args`); automatic prefix
  caching on (vllm/config/cache.py, `enable_prefix_caching`); a request that does not fit in free
  KV blocks preempts the youngest running one, recomputed later (vllm/v1/core/sched/scheduler.py).
- SGLang 0.5.x: `chunked_prefill_size` 8192 on GPUs of 35-160 GiB, H100 and H200 both
  (python/sglang/srt/server_args.py, `_handle_gpu_memory_settings`); `max_prefill_tokens` 16384;
  radix (prefix) cache on (`disable_radix_cache` False); `enable_mixed_chunk` False, so a step is
  a prefill batch or a decode batch, never both, and a waiting prefill goes first
  (python/sglang/srt/managers/scheduler.py, `get_next_batch_to_run`): the `prefill-first` policy.
  `max_running_requests` is sized from KV memory; servesim's KV sizing already caps the running set,
  so it takes vLLM's 1024 as the cap on top.
- TensorRT-LLM 1.x (PyTorch backend): `max_batch_size` 2048 and `max_num_tokens` 8192
  (tensorrt_llm/llmapi/llm_args.py, BuildConfig/TorchLlmArgs defaults); `enable_chunked_prefill`
  False, so a prompt is computed whole, beside the decodes of the step (in-flight batching): the
  `inflight` policy; KV block reuse on (`KvCacheConfig.enable_block_reuse` True); the capacity
  scheduler's `GUARANTEED_NO_EVICT` admits a request only when its whole KV (prompt + max output)
  is free beside what the running ones still need, and never preempts (`policies.inflight`): where
  KV is short, TRT-LLM queues requests that vLLM would start and preempt.
  Its KV cache dtype `auto` follows the checkpoint's metadata (`KvCacheConfig.dtype`: "Use 'auto'
  to follow checkpoint metadata"), and an FP8 checkpoint (ModelOpt, `kv_cache_quant_algo` FP8, as
  NVIDIA's FP8 checkpoints ship) stores KV in fp8: one byte per element, twice the tokens in the
  same memory and half the bytes a decode step reads.
- All three plan each step while the one before it runs (`async_scheduling`,
  `simulator.engine.server`): vLLM's `--async-scheduling`, on by default from 0.14 unless pipeline
  parallelism, some speculative methods or the Ray executor turn it off (vllm/config/vllm.py);
  SGLang's overlap scheduler (`disable_overlap_schedule` False, `event_loop_overlap`);
  TensorRT-LLM's overlap executor loop (`disable_overlap_scheduler` False). TensorRT-LLM's and
  SGLang's loops process a step's outputs after launching the next step, so they can reach the
  clients only when that step ends if it computes prompt tokens (`output_lag`,
  `simulator.engine.delivery`): on for TensorRT-LLM, whose measured rows support it; off for
  SGLang and vLLM (0.16 and 0.18, scheduling asynchronously), whose rows do not
  (docs/validation/stack-fidelity.md).

aiconfigurator's benchmark templates set these differently (ai-dynamo/aiconfigurator 095f58a,
src/aiconfigurator/generator/rule_plugin/benchmark/{vllm,sglang,trtllm}.rule): max batch 128, vLLM's
and TRT-LLM's token budget max batch + isl + 1500 (TRT-LLM's rounded up to its 32-token blocks),
SGLang's `max_prefill_tokens` isl + 1500 with `enable_mixed_chunk` true, TRT-LLM's block reuse off
(its templates' default), its overlap scheduler on. `bench_scheduler` gives those; whether the
measured table's harness used them is not known (../shared/reference/serving/README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from simulator.errors import InputError, clip

BACKENDS = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class StackDefaults:
    """A stack's scheduler as a stock server starts it (module docstring)."""

    backend: str
    version: str
    """The version these defaults, and its profile's kernels, are of."""
    policy: str
    max_num_batched_tokens: int
    """The step's token budget (vLLM max_num_batched_tokens, SGLang chunked_prefill_size,
    TRT-LLM max_num_tokens)."""
    max_num_seqs: int
    """Most requests running at once (vLLM max_num_seqs, SGLang max_running_requests, TRT-LLM
    max_batch_size)."""
    enable_prefix_caching: bool
    """vLLM's prefix caching, SGLang's radix cache, TRT-LLM's KV block reuse."""
    fp8_kv_with_fp8_weights: bool = False
    """The KV cache is fp8 where the weights are (TRT-LLM: its `auto` KV dtype follows an FP8
    checkpoint's); else it is the model's dtype unless the user says otherwise."""
    async_scheduling: bool = True
    """Each step planned while the one before it runs (vLLM's async scheduling, SGLang's and
    TRT-LLM's overlap scheduler; module docstring)."""
    output_lag: bool = False
    """A step's outputs reach the clients when the next step ends if it computes prompt tokens
    (TRT-LLM's overlap loop; module docstring)."""


DEFAULTS = {
    "vllm": StackDefaults("vllm", "0.19.0", "chunked", 8192, 1024, True),
    "sglang": StackDefaults("sglang", "0.5.14", "prefill-first", 8192, 1024, True),
    "trtllm": StackDefaults("trtllm", "1.3.0rc20", "inflight", 8192, 2048, True, True, output_lag=True),
}
BENCH_MAX_BATCH = 128
"""aiconfigurator's benchmark templates' max batch size where none is given."""
TRTLLM_TOKENS_PER_BLOCK = 32


def stack_defaults(backend: str) -> StackDefaults:
    if backend not in DEFAULTS:
        raise InputError(f"unknown --backend {clip(repr(backend))} (choose from {', '.join(BACKENDS)})")
    return DEFAULTS[backend]


def stack_profile(gpu: str, backend: str, shipped: list[str]) -> str:
    """The profile of `backend` on `gpu`: `<gpu>_<backend>` where `gpu` is a shipped base profile
    that has one, else `gpu` as given (a folder, or a profile already of a stack)."""
    stack_defaults(backend)
    return f"{gpu}_{backend}" if f"{gpu}_{backend}" in shipped else gpu


def bench_scheduler(backend: str, input_len: int, max_batch: int = BENCH_MAX_BATCH) -> StackDefaults:
    """The scheduler aiconfigurator's benchmark templates render for an aggregated server of
    `backend` serving `input_len`-token prompts (module docstring): budget max batch + isl + 1500."""
    stock = stack_defaults(backend)
    budget = max_batch + input_len + 1500
    if backend == "trtllm":  # KV block reuse off; the budget in whole blocks
        budget = -(-budget // TRTLLM_TOKENS_PER_BLOCK) * TRTLLM_TOKENS_PER_BLOCK
    # SGLang's enable_mixed_chunk true: chunked prefill mixed with decodes, as vLLM's
    return replace(stock, policy="chunked" if backend == "sglang" else stock.policy, max_num_batched_tokens=budget,
                   max_num_seqs=max_batch, enable_prefix_caching=backend != "trtllm")


VLLM_ASYNC_SINCE = (0, 14)
"""vLLM schedules asynchronously by default from 0.14.0 on (its release notes: "Async scheduling is
now enabled by default", vllm-project/vllm#27614); before, `--async-scheduling` was opt-in."""


def async_by_default(backend: str, version: str | None) -> bool:
    """Did `version` of `backend` schedule asynchronously by default? SGLang's overlap scheduler is on
    by default throughout 0.5 (`disable_overlap_schedule` False) and TensorRT-LLM's throughout 1.x
    (`disable_overlap_scheduler` False); vLLM's from 0.14 (`VLLM_ASYNC_SINCE`). An unknown version
    is taken as the stock one's."""
    if backend != "vllm" or version is None:
        return stack_defaults(backend).async_scheduling
    numbers = [int(part) for part in re.findall(r"\d+", version)[:2]]
    return len(numbers) < 2 or tuple(numbers) >= VLLM_ASYNC_SINCE


STACK_SETTINGS = ("policy", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching", "async_scheduling",
                  "output_lag")


def stack_settings(settings: dict[str, object], given: set[str], shipped: list[str]) -> dict[str, object]:
    """What `--backend` sets (it was given): its profile for a shipped base `--gpu`, its stock
    scheduler for each of `STACK_SETTINGS` the user did not give, and, for a stack whose KV follows
    fp8 weights (TensorRT-LLM), an fp8 KV cache under `--quantization fp8` unless `--kv-cache-dtype`
    was given."""
    backend = str(settings["backend"])
    stock = stack_defaults(backend)
    chosen: dict[str, object] = {"gpu": stack_profile(str(settings["gpu"]), backend, shipped)}
    if stock.fp8_kv_with_fp8_weights and settings.get("quantization") == "fp8" and "kv_cache_dtype" not in given:
        chosen["kv_cache_dtype"] = "fp8"
    chosen |= {name: getattr(stock, name) for name in STACK_SETTINGS if name not in given}
    if "output_lag" not in given and not (settings | chosen)["async_scheduling"]:
        chosen["output_lag"] = False  # --no-async-scheduling: no overlap loop to lag
    return chosen
