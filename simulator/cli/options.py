"""Command-line options shared by the verbs that price a deployment (run, batch-table, validate);
their defaults and checks are `RunConfig`'s, never copied here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from simulator.config import DEFAULTS as FIELD_DEFAULTS
from simulator.config import SPECULATIVE_METHODS, RunConfig
from simulator.deploy.model import KV_CACHE_DTYPES, QUANTIZATIONS
from simulator.errors import InputError
from simulator.ranges import RANGES, Range, flag, quote

F = TypeVar("F", bound=Callable[..., Any])
DEFAULTS = RunConfig()
RESULTS_DIR = Path("results")
"""Where run and batch-table write when not told where."""


class SettingType(click.ParamType):
    """A number-valued setting read from its flag: typed and range-checked by its `RANGES` entry (or
    the range given), so a bad value gets the same line here as in a sweep file or a `RunConfig`."""

    def __init__(self, setting: str, bounds: Range | None = None) -> None:
        self.setting = setting
        self.bounds = bounds or RANGES[setting]
        self.name = "integer" if self.bounds.kind is int else "float"  # as click names its own

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        return self.bounds.parse(self.setting, value)


class Choice(click.Choice):
    """click's choice, refused as `RunConfig` refuses a name: one line quoting at most 80 characters
    of the value (click's own quotes all of it)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            name = param.opts[0] if param is not None else "value"
            raise InputError(f"unknown {name} {quote(value)} (choose from {', '.join(map(str, self.choices))})"
                             ) from None


def setting(name: str, *aliases: str, help: str, **kwargs: Any) -> Callable[[F], F]:
    """The option of RunConfig field `name` (any vLLM names as aliases), its default taken from RunConfig
    and, for a number, its type from `RANGES`."""
    default = FIELD_DEFAULTS[name]
    kwargs.setdefault("show_default", default is not None)
    if name in RANGES:
        kwargs.setdefault("type", SettingType(name))
    return click.option(flag(name), *aliases, name, default=default, help=help, **kwargs)


def deployment_options(command: F) -> F:
    """--tensor-parallel-size, --quantization and --kv-cache-dtype, as vLLM names them."""
    for option in reversed((
        setting("tensor_parallel_size", help="GPUs the model is split across (tensor parallelism); times and memory "
                                             "per GPU."),
        click.option("--quantization", type=Choice(QUANTIZATIONS), default=DEFAULTS.quantization,
                     help="fp8: the linear layers' weights in fp8 [default: the checkpoint's]."),
        click.option("--kv-cache-dtype", type=Choice(KV_CACHE_DTYPES), default=DEFAULTS.kv_cache_dtype,
                     show_default=True, help="KV cache element type (auto: the model's dtype)."),
    )):
        command = option(command)
    return command


def parallel_options(command: F) -> F:
    """--enable-expert-parallel and --data-parallel-size (MoE models) and --disable-custom-all-reduce,
    as vLLM names them."""
    for option in reversed((
        click.option("--enable-expert-parallel", "enable_expert_parallel", is_flag=True,
                     default=DEFAULTS.enable_expert_parallel,
                     help="Spread a MoE model's routed experts whole over the GPUs (tensor x data parallel) "
                          "instead of splitting each."),
        setting("data_parallel_size", help="Data-parallel attention ranks of --tensor-parallel-size GPUs each, "
                                           "their experts one group (needs --enable-expert-parallel)."),
        click.option("--disable-custom-all-reduce", "disable_custom_all_reduce", is_flag=True,
                     default=DEFAULTS.disable_custom_all_reduce,
                     help="As vllm serve: every all-reduce by NCCL, the stack's custom all-reduce off (as where "
                          "GPUs lack peer access); on one GPU, as there, it changes nothing."),
    )):
        command = option(command)
    return command


def speculative_options(command: F) -> F:
    """Speculative decoding, as vLLM's --speculative-config (method, num_speculative_tokens, model),
    and the acceptance model the simulator needs in place of the drafts' text."""
    for option in reversed((
        setting("speculative_method", type=Choice(SPECULATIVE_METHODS),
                help="Speculative decoding: each decode step drafts --num-speculative-tokens tokens (ngram: a "
                     "lookup on the host; eagle: a one-layer head; mtp: the model's MTP layer; draft: "
                     "--draft-model) and verifies them in one pass [default: none].", show_default=False),
        setting("num_speculative_tokens", help="Draft tokens per decode step (k); a step emits 1 to k + 1 tokens "
                                               "(0: none, the run without speculation) [default: none]."),
        setting("spec_acceptance", help="Probability that a draft token is accepted given the ones before it were: "
                                        "one for every position, or k separated by commas (e.g. 0.8,0.6,0.5) "
                                        "[default: none]."),
        setting("draft_model", help="The draft model of --speculative-method draft (a built-in name or a "
                                    "config.json sharing the model's vocabulary) [default: none]."),
    )):
        command = option(command)
    return command


def aligned(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns as wide as their widest cell, two spaces apart: wide values never touch."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return "\n".join("".join(f"{cell:>{width + 2}}" for cell, width in zip(line, widths, strict=True))
                     for line in [headers, *rows])
