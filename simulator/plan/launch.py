"""What a plan hands on: each deployment's `simulate run` flags (its capacity point reproduced), its
`vllm serve` lines, and the files `vllm bench sweep serve_sla` reads to check the plan on GPUs
(`serve_params.json`, `bench_params.json`, `sla_params.json`: lists of parameter objects, as its
`ParameterSweep` and `SLASweep` read them).

P/D pools launch as vLLM documents disaggregated prefill with NIXL: every server with
`--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`, a proxy in front
sending each request to a prefill server, then to a decode server.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from simulator.config import DEFAULTS
from simulator.plan.slo import Slos
from simulator.sweep.grid import flag

NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
SKIPPED = ("percentiles", "goodput", "duration")
PORT = 8000


def simulate_args(settings: dict[str, Any], rate: float, num_requests: int, slos: Slos | None = None) -> str:
    """The `simulate run` command that reruns `settings` at `rate`: every setting away from its default
    (a trace's speed scaled to the rate), and the percentiles and goodput SLOs that `slos` judge."""
    from simulator.plan.capacity import load_settings

    args = ["simulate", "run"]
    load = load_settings(settings, rate, num_requests)
    for name, value in (settings | load).items():
        if name in SKIPPED or value == DEFAULTS[name]:
            continue
        if isinstance(value, bool):
            args.append(flag(name) if value else f"--no-{flag(name)[2:]}")
        else:
            args += [flag(name), repr(value) if isinstance(value, float) else str(value)]
    if slos is not None:
        args += ["--percentiles", ",".join(f"{q:g}" for q in slos.percentiles())]
        if slos.goodput:
            args += ["--goodput", " ".join(f"{metric}:{limit * 1e3:g}" for metric, limit in slos.goodput)]
    return shlex.join(args)


def model_id(model: str) -> str:
    """The Hugging Face name vLLM serves: the one a built-in model's config.json came from."""
    from simulator.deploy.model import load_model

    source = load_model(model).source
    if source.startswith("Hugging Face "):
        return source.removeprefix("Hugging Face ").split()[0]
    return model


def serve_params(settings: dict[str, Any], tensor_parallel_size: int | None = None) -> dict[str, Any]:
    """vllm serve's flags for one server of `settings` (as a serve_params.json object)."""
    params: dict[str, Any] = {
        "tensor_parallel_size": tensor_parallel_size or settings["tensor_parallel_size"],
        "max_num_seqs": settings["max_num_seqs"],
        "max_num_batched_tokens": settings["max_num_batched_tokens"],
        "enable_chunked_prefill": settings["policy"] == "chunked",
        "gpu_memory_utilization": settings["gpu_memory_utilization"],
        "enable_prefix_caching": settings["enable_prefix_caching"],
    }
    if settings.get("quantization"):
        params["quantization"] = settings["quantization"]
    if settings.get("kv_cache_dtype", "auto") != "auto":
        params["kv_cache_dtype"] = settings["kv_cache_dtype"]
    if settings.get("max_model_len"):
        params["max_model_len"] = settings["max_model_len"]
    return params


def serve_line(model: str, params: dict[str, Any], port: int, first_gpu: int, extra: list[str]) -> str:
    gpus = ",".join(str(first_gpu + i) for i in range(params["tensor_parallel_size"]))
    args = [f"CUDA_VISIBLE_DEVICES={gpus}", "vllm", "serve", model_id(model), "--port", str(port)]
    for name, value in params.items():
        args += [flag(name) if value else f"--no-{flag(name)[2:]}"] if isinstance(value, bool) else [flag(name),
                                                                                                     str(value)]
    return " ".join([*args[:1], shlex.join(args[1:] + extra)])


def launch(settings: dict[str, Any]) -> str:
    """The deployment's `vllm serve` lines, one per server, and how requests reach them."""
    lines: list[str] = []
    gpu = 0
    if settings.get("prefill_replicas") is not None:
        ports: dict[str, list[int]] = {"prefill": [], "decode": []}
        for role in ("prefill", "decode"):
            params = serve_params(settings, settings.get(f"{role}_tensor_parallel_size"))
            for _ in range(settings[f"{role}_replicas"]):
                port = PORT + len(lines)
                lines.append(serve_line(settings["model"], params, port, gpu, ["--kv-transfer-config", NIXL]))
                ports[role].append(port)
                gpu += params["tensor_parallel_size"]
        on = {role: f" ({settings[f'{role}_gpu']})" if settings.get(f"{role}_gpu") else "" for role in ports}
        lines.append(f"# a P/D proxy (vLLM's disaggregated-serving example) in front: prefill on ports "
                     f"{','.join(map(str, ports['prefill']))}{on['prefill']}, then decode on "
                     f"{','.join(map(str, ports['decode']))}{on['decode']}")
        return "\n".join(lines)
    params = serve_params(settings)
    for _ in range(settings["num_replicas"]):
        lines.append(serve_line(settings["model"], params, PORT + len(lines), gpu, []))
        gpu += params["tensor_parallel_size"]
    if settings["num_replicas"] > 1:
        lines.append(f"# a {settings['router']} router in front of ports {PORT}-{PORT + settings['num_replicas'] - 1}")
    return "\n".join(lines)


def bench_params(settings: dict[str, Any], rate: float, num_requests: int) -> dict[str, Any]:
    """`vllm bench serve` flags that send the plan's workload at `rate` (a bench_params.json object)."""
    if settings.get("trace") is not None:  # vllm bench's custom dataset reads the prompts; servesim read the trace
        return {"dataset_name": "custom", "dataset_path": settings["trace"], "request_rate": round(rate, 4),
                "num_prompts": num_requests}
    params: dict[str, Any] = {"dataset_name": "random", "random_input_len": settings["input_len"],
                              "random_output_len": settings["output_len"], "request_rate": round(rate, 4),
                              "num_prompts": num_requests, "seed": settings["seed"]}
    if settings.get("prefix_len"):
        params["random_prefix_len"] = settings["prefix_len"]
    if settings.get("burstiness", 1.0) != 1.0:
        params["burstiness"] = settings["burstiness"]
    return params


def dump(records: list[dict[str, Any]]) -> str:
    return json.dumps(records, indent=2) + "\n"
