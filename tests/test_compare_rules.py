"""`simulate compare` reruns a silicon table's rows as the data supports they ran, per stack
(`simulator.sim2real.sweeps.SUPPORTED`), on the stack's own profile; `--client plain` reruns them on
the scheduler the flags give."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from test_compare import outcome, write_csv
from test_compare_formats import AGG

from simulator.sim2real.compare import Scheduler

# A vLLM row whose prompts do not all fit vLLM's default budget of 8,192 tokens in one step
# (8 x 3,000), so the budget rule shows in its TTFT.
VLLM = AGG | {"id": "v1", "backend": "vllm", "backend_version": "0.12.0", "isl": "3000",
              "silicon_data_source": "silicon_concurrency=8", "batch_size": "8"}


def rows(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *flags: str) -> pl.DataFrame:
    path = write_csv(tmp_path / "silicon.csv", VLLM, AGG)
    code, _, err = outcome(["compare", str(path), "--jobs", "1", "--out", str(tmp_path / name), *flags], capsys)
    assert code == 0, err
    return pl.read_parquet(tmp_path / name).sort("point", "statistic")


def test_a_vllm_silicon_row_reruns_with_the_templates_budget_by_default(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # aiconfigurator's templates: max batch 128 (more than the 8 clients), budget 128 + 3000 + 1500.
    default = rows(tmp_path, capsys, "default.parquet")
    by_hand = rows(tmp_path, capsys, "hand.parquet", "--client", "plain", "--max-num-batched-tokens", "4628",
                   "--max-num-seqs", "128")
    plain = rows(tmp_path, capsys, "plain.parquet", "--client", "plain")
    vllm = pl.col("point") == "v1"
    assert default.filter(vllm).equals(by_hand.filter(vllm))
    assert not default.filter(vllm)["simulated"].equals(plain.filter(vllm)["simulated"])
    # SGLang's supported rule is its stock scheduler with NCCL's all-reduce, which --client plain
    # gives it with --disable-custom-all-reduce; without, its TP 2 decode steps are shorter.
    sglang = pl.col("point") == "a1"
    nccl = rows(tmp_path, capsys, "nccl.parquet", "--client", "plain", "--disable-custom-all-reduce")
    assert default.filter(sglang).equals(nccl.filter(sglang))
    tpot = pl.col("statistic") == "tpot_mean"
    assert (plain.filter(sglang & tpot)["simulated"] < default.filter(sglang & tpot)["simulated"]).all()


def test_a_tensorrt_llm_silicon_row_reruns_with_the_templates_budget_by_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 8 clients of 8,192-token prompts: the stock budget (8,192 tokens, decoders included) would hold
    # one only in a step with no decoder. The templates': 128 + 8,192 + 1,500, rounded up to 32.
    row = AGG | {"id": "t1", "backend": "trtllm", "backend_version": "1.0.0rc3", "isl": "8192", "osl": "64",
                 "silicon_data_source": "silicon_concurrency=8", "batch_size": "8"}
    path = write_csv(tmp_path / "silicon.csv", row)

    def rerun(name: str, *flags: str) -> pl.DataFrame:
        code, _, err = outcome(["compare", str(path), "--jobs", "1", "--out", str(tmp_path / name), *flags], capsys)
        assert code == 0, err
        return pl.read_parquet(tmp_path / name).sort("statistic")

    default = rerun("default.parquet")
    by_hand = rerun("hand.parquet", "--client", "plain", "--max-num-batched-tokens", "9824", "--max-num-seqs", "128")
    stock = rerun("stock.parquet", "--client", "plain", "--max-num-batched-tokens", "8192", "--max-num-seqs", "2048")
    assert default.equals(by_hand)
    ttft = pl.col("statistic") == "ttft_mean"
    # Under the stock budget the clients' prompts run one at a time, each once nobody decodes.
    assert stock.filter(ttft)["simulated"][0] > 3 * default.filter(ttft)["simulated"][0]


def test_each_row_reruns_on_its_own_stacks_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = rows(tmp_path, capsys, "default.parquet")
    assert dict(table.select("point", "gpu").unique().iter_rows()) == {"v1": "h100_sxm_vllm",
                                                                        "a1": "h100_sxm_sglang"}


def test_help_says_how_to_rerun_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = outcome(["compare", "--help"], capsys)
    assert code == 0 and "--client [supported|plain]" in out and "max batch + isl + 1500" in " ".join(out.split())


@pytest.mark.parametrize(("backend", "quant", "kv"), [("trtllm", "fp8", "fp8"), ("trtllm", "", "auto"),
                                                      ("vllm", "fp8", "auto"), ("sglang", "fp8", "auto")])
def test_tensorrt_llm_stores_kv_in_fp8_where_its_weights_are(tmp_path: Path, backend: str, quant: str,
                                                             kv: str) -> None:
    # TensorRT-LLM's KV dtype `auto` follows the checkpoint: an FP8 checkpoint's KV is fp8. vLLM's and
    # SGLang's `auto` is the model's dtype.
    from simulator.sim2real.compare import point_config
    from simulator.sim2real.measured import read_measured
    from simulator.sim2real.sweeps import SUPPORTED
    from simulator.sim2real.units import point_scheduler

    row = AGG | {"backend": backend, "backend_version": "1.0.0rc3", "gemm_quant_mode": quant, "precision": quant}
    [point] = read_measured(write_csv(tmp_path / "silicon.csv", row)).points
    assert point.quantization == (quant or None)
    scheduler = point_scheduler(point, Scheduler(), SUPPORTED[backend])
    assert point_config(point, "h100_sxm", 0, scheduler).kv_cache_dtype == kv
    assert point_config(point, "h100_sxm").kv_cache_dtype == kv  # --client plain: the stack's stock server


@pytest.mark.parametrize(("gpu", "backend", "quant", "tp", "fitted"), [
    ("h100_sxm_vllm", "vllm", "", 2, True), ("h100_sxm_vllm", "vllm", "", 4, False),
    ("h100_sxm_vllm", "vllm", "fp8", 2, False), ("h100_sxm_trtllm", "trtllm", "fp8", 8, True),
    ("h100_sxm_trtllm", "trtllm", "fp8", 1, False), ("h200_sxm_vllm", "vllm", "fp8", 2, False)])
def test_a_row_is_held_out_unless_its_profiles_fit_could_have_used_it(gpu: str, backend: str, quant: str, tp: int,
                                                                      fitted: bool) -> None:
    # The shipped H100 stack profiles were fitted on TP 2 and 8 (bf16 vLLM, fp8 TensorRT-LLM); the
    # H200 profile on nothing.
    from simulator.sim2real.compare import fitted_by_profile

    row = {"gpu": gpu, "backend": backend, "mode": "agg", "quantization": quant, "tensor_parallel_size": tp}
    assert fitted_by_profile(row) is fitted
    assert fitted_by_profile(row | {"mode": "disagg"}) is False


def test_held_out_and_fitted_rows_are_summarised_apart() -> None:
    # Two TP 2 rows (the shipped h100_sxm_vllm fit's sizes) and one TP 4 row, by hand.
    import polars as pl

    from simulator.sim2real.compare import held_out_summary

    rows = pl.DataFrame([{"gpu": "h100_sxm_vllm", "backend": "vllm", "mode": "agg", "quantization": "",
                          "tensor_parallel_size": tp, "group": "g", "statistic": "ttft_mean", "error": error}
                         for tp, error in ((2, 0.1), (2, -0.3), (4, -0.4))])
    table = {(r["group"], r["fitted"]): (r["points"], r["median_abs_error"])
             for r in held_out_summary(rows).iter_rows(named=True)}
    assert table == {("all", True): (2, pytest.approx(0.2)), ("all", False): (1, pytest.approx(0.4)),
                     ("g", True): (2, pytest.approx(0.2)), ("g", False): (1, pytest.approx(0.4))}


def test_rows_of_assumed_workers_get_their_stack_a_line_without_them() -> None:
    # TensorRT-LLM: a stated row (error 0.1) and two guessed (0.5, 0.9); vLLM stated only (0.2).
    import polars as pl

    from simulator.sim2real.compare import held_out_summary

    rows = pl.DataFrame([{"gpu": "h200_sxm_trtllm", "backend": backend, "mode": "disagg", "quantization": "",
                          "tensor_parallel_size": 8, "group": group, "statistic": "tpot_mean", "error": error}
                         for backend, group, error in (("trtllm", "d disagg", 0.1),
                                                       ("trtllm", "d disagg (workers assumed)", -0.5),
                                                       ("trtllm", "d disagg (workers assumed)", 0.9),
                                                       ("vllm", "q disagg", 0.2))])
    table = {(r["backend"], r["group"]): (r["points"], r["median_abs_error"])
             for r in held_out_summary(rows).iter_rows(named=True)}
    assert table == {("trtllm", "all"): (3, pytest.approx(0.5)),
                     ("trtllm", "all, workers stated"): (1, pytest.approx(0.1)),
                     ("trtllm", "d disagg"): (1, pytest.approx(0.1)),
                     ("trtllm", "d disagg (workers assumed)"): (2, pytest.approx(0.7)),
                     ("vllm", "all"): (1, pytest.approx(0.2)), ("vllm", "q disagg"): (1, pytest.approx(0.2))}
