"""aiconfigurator's silicon table: end-to-end measurements of real servers, one row per benchmark.

Two layouts are read. The upstream one, every column as aiconfigurator ships it
(`aic-core/src/aiconfigurator_core/systems/silicon_sample.csv`): `batch_size` is each attention-data-
parallel rank's batch, `mode` is `agg` or `disagg` (then `prefill_*`/`decode_*` give each pool's
workers, batch size and parallelism), `pp_size`, `attention_dp_size`, `moe_tp_size`, `moe_ep_size`,
`gemm_quant_mode`, `moe_quant_mode`, and `silicon_data_source` (where and when it was measured, with
`silicon_concurrency=N`, the client's concurrency). And the renamed one servesim was first built on
(`concurrency`, `tp_size`, aggregated rows of vLLM).

The client's concurrency is `silicon_concurrency` where the source says it; else, for an aggregated
row, `batch_size` x `attention_dp_size`, and for a disaggregated one the decode pool's
`decode_batch_size` x `decode_num_workers` x `decode_attention_dp_size` (the rule every row that
says its concurrency in the reference table follows). The client ran a closed loop of that many
clients: `concurrency` warm-up requests, then 10 x `concurrency` measured.

What is inferred where a row is short or inconsistent (docs/guides/measured-results.md says why):
- a disaggregated row that gives each pool's parallelism and `silicon_concurrency` but no worker
  counts nor batch sizes (DeepSeek-R1's Dynamo rows) takes the pools of a row that records the
  same measurement (GPU, stack, lengths, TTFT and TPOT cell for cell) and gives them (`with_twins`);
  without one it is one prefill and one decode worker, the smallest deployment of the pools it
  states;
- an aggregated row whose id names `tpN_epN` (or no parallelism at all) but whose columns say N x N
  GPUs is the N-GPU deployment (`unsquared`);
- a 4-bit quant mode on a checkpoint whose routed experts are 4-bit is the checkpoint's own weights.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import fields
from pathlib import Path

from simulator.config import RunConfig
from simulator.deploy.model import load_model
from simulator.deploy.resolve import ModelResolver, Resolved
from simulator.errors import InputError, clip
from simulator.sim2real.points import (
    MAX_CONCURRENCY,
    MAX_MS,
    MAX_TENSOR_PARALLEL,
    MAX_TOKENS,
    MAX_WORKERS,
    MIN_MS,
    MODES,
    MeasuredPoint,
    PoolShape,
    Reading,
    Unmappable,
    map_backend,
    map_gpu,
    optional_int,
    positive_float,
    positive_int,
    read_text,
    resolve,
)

COMMON = ("id", "backend", "model_path", "system", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
RENAMED = ("id", "backend", "backend_version", "model_path", "system", "precision", "gemm_quant_mode", "isl", "osl",
           "concurrency", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms")
"""The renamed layout's columns (all needed)."""
UPSTREAM = (*COMMON, "mode", "batch_size", "tp_size")
"""The upstream layout's columns without which no row can be read; the others default to unset."""
POOL_FIELDS = ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
BF16 = ("", "bfloat16", "bf16", "float16", "fp16")
FP8 = ("fp8", "fp8_block")
EXPERT_PARALLEL = "expert/data parallel attention"
"""The skip reason of rows with attention data parallelism or expert parallelism."""
CONCURRENCY_NOTE = re.compile(r"silicon_concurrency=([0-9]+)")
FOUR_BIT = ("nvfp4", "mxfp4", "fp4", "int4", "int4_wo", "w4a16", "w4a16_mxfp4")
"""4-bit quant modes: on Hopper (no fp4 tensor cores) a 4-bit expert runs weight-only, 16-bit activations."""
FOUR_BIT_EXPERTS = ("mxfp4", "int4")
"""A checkpoint's own 4-bit expert dtypes (`ModelSpec.expert_dtype`)."""
SQUARED_ID = re.compile(r"_tp([0-9]+)(?:_0)?_ep([0-9]+)(?:_0)?_[0-9]+$")
NAMES_TP = re.compile(r"_tp[0-9]+")


def csv_rows(path: Path) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    """A CSV's header and rows, each row with where it is ("points.csv line 7": the header is line 1,
    and a quoted cell may hold line breaks, as in an editor); blank lines skipped."""
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    rows = []
    begun = 1
    try:
        header = next(reader, [])
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise InputError(f"{path.name} line 1: column(s) {clip(', '.join(repeated))} given twice")
        begun = reader.line_num + 1
        for cells in reader:
            if cells and len(cells) != len(header):
                raise InputError(f"{path.name} line {begun}: {len(cells)} fields where the header has {len(header)}")
            if cells:
                rows.append((f"{path.name} line {begun}", dict(zip(header, cells, strict=True))))
            begun = reader.line_num + 1
    except csv.Error as exc:
        raise InputError(f"{path.name} line {begun}: {clip(str(exc))}") from None
    return header, rows


def silicon_layout(header: list[str], path: Path) -> str:
    """`upstream` or `renamed`; a file of neither is refused in one line naming what it lacks."""
    layout = "upstream" if "batch_size" in header or "mode" in header else "renamed"
    wanted: tuple[str, ...] = UPSTREAM if layout == "upstream" else RENAMED
    missing = [c for c in wanted if c not in header]
    if missing:
        raise InputError(f"{str(path)!r} lacks the column(s) {', '.join(missing)} of a silicon CSV")
    return layout


def read_silicon_csv(path: Path, resolver: ModelResolver) -> Reading:
    """Every row of the table as a point, or skipped with its reason."""
    header, rows = csv_rows(path)
    layout = silicon_layout(header, path)
    if not rows:
        raise InputError(f"{str(path)!r} has no rows")
    reading = Reading()
    for where, row in with_twins(rows):
        try:
            reading.points.append(silicon_point(row, where, resolver, layout))
        except Unmappable as skip:
            reading.skipped.append((where, skip.reason))
    return reading


TWIN_KEY = ("system", "backend", "isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")
"""What makes two rows one measurement: the same GPU, stack and lengths, and the same TTFT and TPOT
to the last digit written (the upstream table holds some runs twice, from two source files)."""


def with_twins(rows: list[tuple[str, dict[str, str]]]) -> list[tuple[str, dict[str, str]]]:
    """The rows, each disaggregated one without worker counts given the pools (every `prefill_*` and
    `decode_*` cell) of a row that records the same measurement and gives its workers. In the
    reference table 48 of DeepSeek-R1's 248 such rows have one, labelled DeepSeek-V3 with `dsr1`
    ids, whose decode batch x workers x attention-DP ranks is the first row's `silicon_concurrency`
    in every case (`tests/test_compare_models.py`)."""
    def workers(row: dict[str, str]) -> bool:
        return all(row.get(f"{role}_num_workers", "").strip() for role in ("prefill", "decode"))

    def key(row: dict[str, str]) -> tuple[str, ...] | None:
        cells = tuple(row.get(name, "").strip() for name in TWIN_KEY)
        return cells if all(cells) and row.get("mode", "").strip() == "disagg" else None

    given = {key(row): row for _, row in rows if workers(row)}
    given.pop(None, None)  # rows that are not disaggregated or lack a key cell twin nothing
    twinned = []
    for where, row in rows:
        twin = None if workers(row) else given.get(key(row))
        if twin is not None:
            row = row | {name: cell for name, cell in twin.items() if name.startswith(("prefill_", "decode_"))}
        twinned.append((where, row))
    return twinned


def expert_parallel_modelled() -> bool:
    """Whether `RunConfig` can say expert parallelism and attention data parallelism."""
    names = {f.name for f in fields(RunConfig)}
    return {"enable_expert_parallel", "data_parallel_size"} <= names


def silicon_point(row: dict[str, str], where: str, resolver: ModelResolver, layout: str = "upstream"
                  ) -> MeasuredPoint:
    """One row as a point: malformed values are an `InputError`, what servesim cannot express `Unmappable`."""
    cell = row.get
    isl = positive_int(row["isl"], "isl", where, MAX_TOKENS)
    osl = positive_int(row["osl"], "osl", where, MAX_TOKENS)
    measured = {"ttft_mean": positive_float(row["silicon_ttft_ms"], "silicon_ttft_ms", where, MAX_MS, MIN_MS) / 1e3,
                "tpot_mean": positive_float(row["silicon_tpot_ms"], "silicon_tpot_ms", where, MAX_MS, MIN_MS) / 1e3}
    mode = (cell("mode") or "agg").strip()
    if mode not in MODES:
        raise InputError(f"{where}: mode must be one of {', '.join(MODES)}, got {clip(repr(mode))}")
    # What servesim cannot express, the model first: a row gets the first reason that applies.
    model = resolve(resolver, row["model_path"])
    backend = map_backend(row["backend"].strip())
    gpu = map_gpu(row["system"].strip())
    four_bit_experts = load_model(model.model).expert_dtype in FOUR_BIT_EXPERTS
    quantization = weight_quantization(model, cell("precision", "").strip(), cell("gemm_quant_mode", "").strip(),
                                       four_bit_experts)
    moe_quant = cell("moe_quant_mode", "").strip() or None
    if model.moe and moe_quant not in (None, *FP8) and moe_quant != quantization and not (
            four_bit_experts and moe_quant in FOUR_BIT):
        raise Unmappable(f"moe_quant_mode {clip(repr(moe_quant))} (servesim prices bf16 and fp8 experts, and a "
                         "checkpoint's own 4-bit ones)")
    prefill = decode = None
    if layout == "renamed":
        concurrency = positive_int(row["concurrency"], "concurrency", where, MAX_CONCURRENCY)
        tp, pp, adp, moe_tp, moe_ep = positive_int(row["tp_size"], "tp_size", where, MAX_TENSOR_PARALLEL), 1, 1, None, 1
    elif mode == "agg":
        tp = positive_int(row["tp_size"], "tp_size", where, MAX_TENSOR_PARALLEL)
        pp = optional_int(cell("pp_size", ""), "pp_size", where, MAX_TENSOR_PARALLEL, 1) or 1
        adp = optional_int(cell("attention_dp_size", ""), "attention_dp_size", where, MAX_TENSOR_PARALLEL, 1) or 1
        moe_tp = optional_int(cell("moe_tp_size", ""), "moe_tp_size", where, MAX_TENSOR_PARALLEL, None)
        moe_ep = optional_int(cell("moe_ep_size", ""), "moe_ep_size", where, MAX_TENSOR_PARALLEL, 1) or 1
        batch = positive_int(row["batch_size"], "batch_size", where, MAX_CONCURRENCY)
        tp, adp, moe_tp, moe_ep, batch = unsquared(row["id"], tp, adp, moe_tp, moe_ep, batch)
        concurrency = noted_concurrency(cell("silicon_data_source", ""), where) or batch * adp
    else:
        prefill, decode = pool_shape(row, "prefill", where), pool_shape(row, "decode", where)
        tp, pp, adp, moe_tp, moe_ep = (prefill.tensor_parallel_size, prefill.pp_size, prefill.attention_dp_size,
                                       prefill.moe_tp_size, prefill.moe_ep_size)
        concurrency = noted_concurrency(cell("silicon_data_source", ""), where) or 0
        if not concurrency and decode.batch_size is None:
            raise Unmappable("a disaggregated row without its concurrency nor decode_batch_size")
        concurrency = concurrency or (decode.batch_size or 0) * decode.workers * decode.attention_dp_size
        if concurrency > MAX_CONCURRENCY:
            raise InputError(f"{where}: a concurrency of {concurrency} is past {MAX_CONCURRENCY}")
    pools = [(pp, adp, moe_tp, moe_ep, tp)] + [(p.pp_size, p.attention_dp_size, p.moe_tp_size, p.moe_ep_size,
                                                p.tensor_parallel_size) for p in (prefill, decode) if p is not None]
    for pool_pp, pool_adp, pool_moe_tp, pool_moe_ep, pool_tp in pools:
        if model.moe and pool_adp > 1 and pool_moe_ep == 1:
            raise Unmappable("attention data parallelism without expert parallelism on a MoE model")
        if pool_pp > 1:
            raise Unmappable("pipeline parallelism (pp_size > 1)")
        if (pool_adp > 1 or pool_moe_ep > 1) and not expert_parallel_modelled():
            raise Unmappable(EXPERT_PARALLEL)
        if model.moe and pool_moe_tp not in (None, pool_tp) and pool_moe_ep == 1:
            raise Unmappable("moe_tp_size other than tp_size without expert parallelism")
        try:
            load_model(model.model).shard(pool_tp)
        except InputError as exc:
            raise Unmappable(f"{model.name}: {exc}") from None
    version = cell("backend_version", "").strip() or None
    return MeasuredPoint(
        name=row["id"] or where, group=group_name(row, model.name, gpu, backend, mode), model=model.model, gpu=gpu,
        tensor_parallel_size=tp, quantization=quantization, num_requests=10 * concurrency, warmup=concurrency,
        concurrency=concurrency, rate=None, burstiness=1.0, input_lens=(isl,), output_lens=(osl,), measured=measured,
        backend=backend, backend_version=version, mode=mode, pp_size=pp, attention_dp_size=adp, moe_tp_size=moe_tp,
        moe_ep_size=moe_ep, moe_quantization=moe_quant if model.moe else None, prefill=prefill, decode=decode)


ASSUMED = "(workers assumed)"
"""The end of the group name of rows that do not say their deployment (`group_name`)."""


def group_name(row: dict[str, str], model: str, gpu: str, backend: str, mode: str) -> str:
    """The row's group for the error tables: model, GPU and stack, its mode if disaggregated, and
    whether its workers were assumed (a disaggregated row that does not give them, rerun as one
    prefill and one decode worker: module docstring), so that a guess is never averaged with rows
    that say what they ran."""
    name = f"{model} {gpu} {backend}"
    if mode != "disagg":
        return name
    given = all(row.get(f"{role}_num_workers", "").strip() for role in ("prefill", "decode"))
    return f"{name} disagg" + ("" if given else f" {ASSUMED}")


def noted_concurrency(source: str, where: str) -> int | None:
    """The `silicon_concurrency=N` that `silicon_data_source` notes, if it does."""
    found = CONCURRENCY_NOTE.search(source)
    return positive_int(found.group(1), "silicon_concurrency", where, MAX_CONCURRENCY) if found else None


def pool_shape(row: dict[str, str], role: str, where: str) -> PoolShape:
    """A disaggregated row's `prefill_*` or `decode_*` pool."""
    cells = {name: row.get(f"{role}_{name}", "") for name in POOL_FIELDS}
    if not cells["tp_size"].strip():
        raise Unmappable(f"a disaggregated row without {role}_tp_size")
    if not cells["num_workers"].strip():
        if not CONCURRENCY_NOTE.search(row.get("silicon_data_source", "")):
            raise Unmappable(f"a disaggregated row without {role}_num_workers nor its concurrency")
        cells["num_workers"] = "1"  # the smallest deployment of the pools the row states (module docstring)
    return PoolShape(
        workers=positive_int(cells["num_workers"], f"{role}_num_workers", where, MAX_WORKERS),
        tensor_parallel_size=positive_int(cells["tp_size"], f"{role}_tp_size", where, MAX_TENSOR_PARALLEL),
        batch_size=optional_int(cells["batch_size"], f"{role}_batch_size", where, MAX_CONCURRENCY, None),
        pp_size=optional_int(cells["pp_size"], f"{role}_pp_size", where, MAX_TENSOR_PARALLEL, 1) or 1,
        attention_dp_size=optional_int(cells["attention_dp_size"], f"{role}_attention_dp_size", where,
                                       MAX_TENSOR_PARALLEL, 1) or 1,
        moe_tp_size=optional_int(cells["moe_tp_size"], f"{role}_moe_tp_size", where, MAX_TENSOR_PARALLEL, None),
        moe_ep_size=optional_int(cells["moe_ep_size"], f"{role}_moe_ep_size", where, MAX_TENSOR_PARALLEL, 1) or 1)


def weight_quantization(model: Resolved, precision: str, gemm: str, four_bit_experts: bool = False) -> str | None:
    """The run's `--quantization` from the row's quant modes: None for bf16 weights (or the checkpoint's
    own fp8, which its config says), `fp8` for fp8 GEMMs on a checkpoint the config does not say is fp8,
    `fp8_block` for block-scaled fp8 on a 16-bit one; a 4-bit mode on a checkpoint whose experts are
    4-bit (gpt-oss's mxfp4, Kimi-K2.5's int4) is the checkpoint's own weights, None."""
    mode = gemm or ("" if precision in BF16 else precision)
    if mode in BF16:
        return None
    if mode == "fp8":
        return None if model.weight_dtype in FP8 else "fp8"
    if mode == "fp8_block":
        if model.weight_dtype == "fp8_block":
            return None
        if model.weight_dtype is None and not model.variant:
            return "fp8_block"
        raise Unmappable("gemm_quant_mode 'fp8_block' on a checkpoint whose config is fp8 without 128 x 128 blocks")
    if mode in FOUR_BIT and four_bit_experts:
        return None
    raise Unmappable(f"gemm_quant_mode {clip(repr(mode))} (servesim prices bf16 and fp8 weights, and a "
                     "checkpoint's own 4-bit experts)")


def unsquared(row_id: str, tp: int, adp: int, moe_tp: int | None, moe_ep: int, batch: int
              ) -> tuple[int, int, int | None, int, int]:
    """An aggregated row's (tp, attention_dp, moe_tp, moe_ep, batch), repairing the upstream table's
    squared worker: a row whose id names `tpN..._epN` but whose columns say N x N GPUs (tp_size x
    attention_dp_size = moe_tp_size x moe_ep_size = N**2) is the N-GPU deployment the id names, as
    the same measurement's row in the earlier source file says: tp_size N**2 and moe_tp_size N was
    tp_size N; attention_dp_size N**2 and moe_tp_size N was attention_dp_size N (batch_size per
    rank N times larger); tp_size = attention_dp_size = N and moe_ep_size N**2 was tp_size N (the
    batch per rank N times larger), each with moe_tp_size 1 and moe_ep_size N. An id that names no
    parallelism at all (DeepSeek-V3's TensorRT-LLM rows, `..._c64_cfg181`) with the first two
    signatures (moe_tp_size = moe_ep_size = N) is read so too: their TPOTs are those of the same
    stack's 8-GPU rows of the same lengths and clients (docs/guides/measured-results.md)."""
    named = SQUARED_ID.search(row_id)
    n = int(named.group(1)) if named and named.group(1) == named.group(2) else 0
    if not NAMES_TP.search(row_id) and moe_tp == moe_ep:
        n = moe_ep
    if n < 2 or tp * adp != n * n or (moe_tp or 1) * moe_ep != n * n:
        return tp, adp, moe_tp, moe_ep, batch
    if (tp, adp, moe_tp) == (n * n, 1, n):
        return n, 1, 1, n, batch
    if (tp, adp, moe_tp) == (1, n * n, n):
        return 1, n, 1, n, batch * n
    if (tp, adp, moe_tp) == (n, n, 1):
        return n, 1, 1, n, batch * n
    return tp, adp, moe_tp, moe_ep, batch
