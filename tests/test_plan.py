"""`simulate plan` end to end: its rows reproduce (a deployment rerun with its own simulate_args meets
every SLO at max_rate and misses one 15% above it, for several seeds), deployments that cannot run
are listed with their reason, random-router fleets are k times one server, and bad input is one line."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import polars as pl
import pytest
from helpers import AZURE, needs_azure

from simulator.cli.main import run

SMALL = ["--model", "llama-3.1-8b", "--input-len", "1000", "--output-len", "100", "--tensor-parallel-size", "1",
         "--quantization", "none", "--max-num-seqs", "64", "--max-gpus", "2", "--jobs", "1",
         "--slo", "p99_ttft_ms<=400", "--slo", "p90_tpot_ms<=25"]


def simulate_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    codes: list[int] = []
    run(args, exit=codes.append)
    out, err = capsys.readouterr()
    return codes[0], out, err


def plan_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[pl.DataFrame, str]:
    out = tmp_path / "plan"
    code, stdout, err = simulate_cli(["plan", *SMALL, *extra, "--out", str(out)], capsys)
    assert code == 0, err
    return pl.read_parquet(out / "plan.parquet"), stdout


def slo_values(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    code, _, err = simulate_cli([*args[1:], "--percentiles", "90,99", "--no-tokens", "--out", str(out)], capsys)
    assert code == 0, err
    summary: dict[str, dict[str, float]] = json.loads((out / "summary.json").read_text())
    return summary["summary"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_deployment_rerun_with_its_simulate_args_meets_the_slos_at_max_rate_and_not_15_percent_above(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int) -> None:
    rows, _ = plan_rows(tmp_path, capsys, "--policy", "chunked", "--max-num-batched-tokens", "512",
                        "--num-replicas", "1", "--seed", str(seed))
    row = rows.filter(pl.col("how") == "simulated").row(0, named=True)
    args = shlex.split(row["simulate_args"])
    assert args[:2] == ["simulate", "run"] and repr(row['max_rate']) in args
    at = slo_values(tmp_path, args, capsys)
    assert at["p99_ttft"] * 1e3 <= 400 and at["p90_tpot"] * 1e3 <= 25 and at["kept_up"] is not False
    above = args.copy()
    above[above.index("--rate") + 1] = f"{row['max_rate'] * 1.15:.6g}"
    over = slo_values(tmp_path, above, capsys)
    assert over["p99_ttft"] * 1e3 > 400 or over["p90_tpot"] * 1e3 > 25 or over["kept_up"] is False
    # The bracket is the stated precision wide, and the row's SLO columns are the rerun's.
    assert row["max_rate_high"] <= row["max_rate"] * 1.05 + 1e-9
    assert row["p99_ttft_ms"] == pytest.approx(at["p99_ttft"] * 1e3)


def test_the_plan_lists_what_cannot_run_and_derives_random_fleets(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows, stdout = plan_rows(tmp_path, capsys, "--policy", "continuous,chunked", "--max-num-batched-tokens",
                             "512,2048", "--router", "random,round-robin")
    refused = rows.filter(pl.col("policy") == "continuous", pl.col("max_num_batched_tokens") == 512)
    assert refused.height >= 1 and not refused["viable"].any()
    assert refused["reason"].str.contains("1000-token prompt").all()
    recompute = rows.filter(pl.col("policy") == "continuous", pl.col("max_num_batched_tokens") == 2048)
    assert recompute["reason"].is_null().all() or recompute["viable"].any()
    for fleet in rows.filter(pl.col("how").str.starts_with("symmetry")).iter_rows(named=True):
        single = rows.filter(pl.col("how") == "simulated", pl.col("num_replicas") == 1,
                             *(pl.col(n) == fleet[n] for n in ("policy", "max_num_batched_tokens", "max_num_seqs")))
        assert fleet["max_rate"] == pytest.approx(fleet["num_replicas"] * single["max_rate"][0], rel=1e-12)
    assert "pick:" in stdout and "vllm serve meta-llama/Meta-Llama-3.1-8B" in stdout
    files = {p.name for p in (tmp_path / "plan").iterdir()}
    assert {"plan.parquet", "serve_params.json", "bench_params.json", "sla_params.json"} <= files
    sla = json.loads((tmp_path / "plan" / "sla_params.json").read_text())
    assert sla == [{"p99_ttft_ms": "<=400", "p90_tpot_ms": "<=25"}]
    serve = json.loads((tmp_path / "plan" / "serve_params.json").read_text())
    assert all({"max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"} <= set(s) for s in serve)


@pytest.mark.parametrize(("args", "said"), [
    (["--slo", "p99_ttft<=500"], "unknown metric 'p99_ttft'"),
    (["--slo", "p99_ttft_ms>=500"], "sets a floor"),
    (["--slo", "p99_ttft_ms<=-1"], "must be > 0"),
    (["--slo", "p99_ttft_ms<=5", "--slo", "p99_ttft_ms<=6"], "gives p99_ttft_ms twice"),
    ([], "a plan needs an SLO"),
    (["--slo", "p99_ttft_ms<=500", "--num-requests", "10"], "a plan sizes its own runs"),
    (["--slo", "p99_ttft_ms<=500", "--gpu-hourly-cost", "h100_sxm"], "PROFILE=USD"),
    (["--slo", "p99_ttft_ms<=500", "--rate", "1,2"], "--rate takes one finite rate"),
    (["--slo", "p99_ttft_ms<=500", "--slo-attainment", "0.9"], "give --goodput"),
])
def test_bad_plan_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                    said: str) -> None:
    code, _, err = simulate_cli(["plan", *args, "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p").exists()


def test_sla_params_file_is_read_as_vllm_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "sla.json"
    good.write_text('[{"p99_ttft_ms": "<=400", "p90_tpot_ms": "<25"}]')
    from simulator.plan.slo import read_sla_params

    slos = read_sla_params(good)
    assert [(s.name, s.operator, s.limit) for s in slos] == [("p99_ttft_ms", "<=", 0.4), ("p90_tpot_ms", "<", 0.025)]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"p99_ttft_ms": "<=400"}, {"p99_ttft_ms": "<=300"}]')
    code, _, err = simulate_cli(["plan", "--sla-params", str(bad), "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and "lists 2 SLAs" in err


def test_with_a_rate_the_plan_picks_the_fewest_gpus_that_serve_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pinned = ["--policy", "chunked", "--max-num-batched-tokens", "512", "--router", "random", "--max-gpus", "4"]
    rows, _ = plan_rows(tmp_path, capsys, *pinned)
    one = rows.filter(pl.col("num_replicas") == 1, pl.col("how") == "simulated")["max_rate"].max()
    assert isinstance(one, float) and one > 0
    target = 2.5 * one  # three replicas behind the random router serve it, two do not
    out = tmp_path / "rate"
    code, stdout, err = simulate_cli(["plan", *SMALL, *pinned, "--rate", f"{target!r}", "--out", str(out)], capsys)
    assert code == 0, err
    picked = pl.read_parquet(out / "plan.parquet").filter(pl.col("viable")).sort("gpus")
    assert picked["gpus"][0] == 3 and "pick: 3xTP1 random" in stdout


def test_with_a_rate_the_fleets_that_serve_it_rank_by_their_searched_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two replicas serve 1.5 x one server's capacity behind either router. The random router's
    # capacity is derived (2 x one, Poisson thinning); round robin's must be searched too, not left
    # at the target it was probed at, or "the most headroom" would compare a capacity with a floor.
    pinned = ["--policy", "chunked", "--max-num-batched-tokens", "512", "--max-num-seqs", "64", "--max-gpus", "2",
              "--router", "random,round-robin"]
    rows, _ = plan_rows(tmp_path, capsys, *pinned)
    one = rows.filter(pl.col("num_replicas") == 1, pl.col("how") == "simulated")["max_rate"].max()
    assert isinstance(one, float) and one > 0
    target = 1.5 * one
    out = tmp_path / "rate"
    code, stdout, err = simulate_cli(["plan", *SMALL, *pinned, "--rate", f"{target!r}", "--out", str(out)], capsys)
    assert code == 0, err
    fleets = pl.read_parquet(out / "plan.parquet").filter(pl.col("viable"), pl.col("num_replicas") == 2)
    assert sorted(fleets["router"].to_list()) == ["random", "round-robin"]
    assert (fleets["max_rate"] >= target).all() and "probed at --rate" not in fleets["how"].to_list()
    robin = fleets.filter(pl.col("router") == "round-robin").row(0, named=True)
    assert robin["max_rate"] > target and robin["max_rate_high"] is not None  # a bracket, not a floor
    best = fleets.sort("max_rate", descending=True).row(0, named=True)
    assert f"pick: 2xTP1 {best['router']}" in stdout


def test_the_bound_is_above_every_capacity_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, _ = plan_rows(tmp_path, capsys, "--exhaustive", "--policy", "chunked,continuous",
                        "--max-num-batched-tokens", "512,2048", "--max-num-seqs", "8,64")
    found = rows.filter(pl.col("how") == "simulated", pl.col("max_rate") > 0)
    assert found.height >= 4
    assert (found["max_rate"] <= found["bound_rate"]).all()


def test_margin_auto_says_none_is_published(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, stdout = plan_rows(tmp_path, capsys, "--policy", "chunked", "--max-num-batched-tokens", "512",
                          "--num-replicas", "1", "--margin", "auto", "--gpu-hourly-cost", "h100_sxm=2")
    assert "no held-out error is published for h100_sxm: --margin auto is 0" in stdout
    assert "per million output tokens" in stdout


def test_margin_auto_lowers_each_limit_by_its_metrics_published_error(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # --backend vllm runs on h100_sxm_vllm, whose profile.json publishes vLLM's held-out TTFT and TPOT error.
    from simulator.deploy.hardware import load_profile

    published = load_profile("h100_sxm_vllm").meta["held_out_error"]
    assert 0 < published["tpot"] < published["ttft"] < 1
    _, stdout = plan_rows(tmp_path, capsys, "--backend", "vllm", "--policy", "chunked", "--max-num-batched-tokens",
                          "512", "--num-replicas", "1", "--margin", "auto")
    assert f"TTFT limits {published['ttft']:.1%} lower, TPOT and ITL {published['tpot']:.1%}" in stdout, stdout
    assert "published for h100_sxm_vllm" in stdout
    ttft, tpot = 400 * (1 - published["ttft"]), 25 * (1 - published["tpot"])
    assert f"p99_ttft_ms<={ttft:g}, p90_tpot_ms<={tpot:g} (tightened as above)" in stdout, stdout
    assert "without the margin the pick would be" in stdout


def test_slos_tighten_by_their_own_metrics_share() -> None:
    from simulator.plan.slo import build_slos

    slos = build_slos(("p99_ttft_ms<=500", "p90_tpot_ms<=20", "mean_e2el_ms<=1000"), None, ("tpot:50",), None)
    tight = slos.tightened({"ttft": 0.2, "tpot": 0.1})
    assert [(s.name, round(s.limit * 1e3, 9)) for s in tight.limits] == [
        ("p99_ttft_ms", 400.0), ("p90_tpot_ms", 18.0), ("mean_e2el_ms", 1000.0)]  # e2el: not named, not tightened
    assert [(m, round(limit * 1e3, 9)) for m, limit in tight.goodput] == [("tpot", 45.0)]
    assert [round(s.limit * 1e3, 9) for s in slos.tightened(0.5).limits] == [250.0, 10.0, 500.0]


def test_a_malformed_published_error_is_not_used(tmp_path: Path) -> None:
    import shutil

    from simulator.cli.plan_command import published_margin
    from simulator.deploy.hardware import load_profile

    for bad in ({"ttft": 1.5, "tpot": 0.1}, {"ttft": "0.2", "tpot": 0.1}, {"ttft": 0.2}, True, -0.1):
        folder = tmp_path / f"p{len(list(tmp_path.iterdir()))}"
        shutil.copytree(load_profile("h100_sxm_vllm").path, folder)
        meta = json.loads((folder / "profile.json").read_text())
        (folder / "profile.json").write_text(json.dumps(meta | {"held_out_error": bad}))
        share, said = published_margin([str(folder)], None)
        assert share == {} and "no held-out error is published" in said, bad


def test_with_seeds_a_close_capacity_holds_on_every_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pinned = ["--policy", "chunked", "--max-num-batched-tokens", "512", "--num-replicas", "1"]
    rows, _ = plan_rows(tmp_path, capsys, *pinned, "--seeds", "3")
    row = rows.filter(pl.col("how") == "simulated").row(0, named=True)
    args = shlex.split(row["simulate_args"])
    for seed in range(3):
        at = slo_values(tmp_path, [*args, "--seed", str(seed)], capsys)
        assert at["p99_ttft"] * 1e3 <= 400 and at["p90_tpot"] * 1e3 <= 25 and at["kept_up"] is not False, seed
    (tmp_path / "one").mkdir()
    alone, _ = plan_rows(tmp_path / "one", capsys, *pinned)  # one seed: no more than what three allow
    assert row["max_rate"] <= alone.filter(pl.col("how") == "simulated")["max_rate"][0]


@needs_azure
def test_a_trace_is_scaled_by_its_speed_and_its_random_fleets_are_simulated(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    # A trace's arrivals are no Poisson stream: random routing does not thin them into one replica's.
    out = tmp_path / "plan"
    code, _, err = simulate_cli(["plan", "--trace", str(AZURE), "--max-gpus", "2", "--policy", "chunked",
                                 "--max-num-batched-tokens", "2048", "--max-num-seqs", "64", "--quantization",
                                 "none", "--tensor-parallel-size", "1", "--router", "random", "--jobs", "1",
                                 "--slo", "p90_ttft_ms<=1000", "--out", str(out)], capsys)
    assert code == 0, err
    rows = pl.read_parquet(out / "plan.parquet")
    fleet = rows.filter(pl.col("num_replicas") == 2).row(0, named=True)
    assert fleet["how"] == "simulated" and "--trace-speed" in fleet["simulate_args"]
    assert "--rate" not in fleet["simulate_args"]


RESUMED = ["--policy", "chunked", "--max-num-batched-tokens", "512,2048", "--num-replicas", "1"]


def interrupted_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                     monkeypatch: pytest.MonkeyPatch) -> tuple[pl.DataFrame, Path, list[float]]:
    """The plan of `RESUMED` whole, and the same plan into a folder of its own interrupted (Ctrl-C)
    after three probes: (whole plan, its folder, the rates probed since, counted on from there)."""
    import simulator.plan.search as search

    whole, _ = plan_rows(tmp_path, capsys, *RESUMED)
    real = search.probe
    calls: list[float] = []

    def counted(settings: dict[str, object], slos: object, rate: float, *args: object) -> object:
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(rate)
        return real(settings, slos, rate, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "probe", counted)
    out = tmp_path / "resumed"
    code, _, err = simulate_cli(["plan", *SMALL, *RESUMED, "--out", str(out)], capsys)  # Ctrl-C
    assert code == 1 and "aborted" in err
    assert not (out / "plan.parquet").exists() and len(list((out / ".probes").glob("*.jsonl"))) == 1
    calls.clear()

    def resumed(settings: dict[str, object], slos: object, rate: float, *args: object) -> object:
        calls.append(rate)
        return real(settings, slos, rate, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "probe", resumed)
    return whole, out, calls


def test_an_interrupted_plan_resumes_from_its_kept_probes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    whole, out, calls = interrupted_plan(tmp_path, capsys, monkeypatch)
    code, stdout, err = simulate_cli(["plan", *SMALL, *RESUMED, "--out", str(out)], capsys)
    assert code == 0 and "resuming the plan" in stdout, err
    assert len(calls) == int(whole["probes"].sum()) - 3  # three before the interruption, the rest after: none twice
    resumed = pl.read_parquet(out / "plan.parquet")
    assert resumed.drop("launch").equals(whole.drop("launch")) and not (out / ".probes").exists()


def test_kept_probes_that_no_probe_measured_are_simulated_again(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept probes are untrusted: one whose line names another rate than its key's, and one with a
    negative throughput, are not taken; the intact one is, and the plan is the uninterrupted one."""
    whole, out, calls = interrupted_plan(tmp_path, capsys, monkeypatch)
    (kept_file,) = (out / ".probes").glob("*.jsonl")
    lines = [json.loads(line) for line in kept_file.read_text().splitlines()]
    assert len(lines) == 3
    lines[0]["rate"] *= 2
    lines[1]["output_throughput"] = -lines[1]["output_throughput"] - 1
    kept_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = simulate_cli(["plan", *SMALL, *RESUMED, "--out", str(out)], capsys)
    assert code == 0, err
    assert len(calls) == int(whole["probes"].sum()) - 1  # only the intact kept probe is not run again
    assert pl.read_parquet(out / "plan.parquet").drop("launch").equals(whole.drop("launch"))


def test_goodput_attainment_holds_at_max_rate_on_a_rerun(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code, stdout, err = simulate_cli(["plan", *SMALL[:-4], "--policy", "chunked", "--max-num-batched-tokens", "512",
                                      "--num-replicas", "1", "--goodput", "ttft:400 tpot:25", "--slo-attainment",
                                      "0.95", "--out", str(out)], capsys)
    assert code == 0 and "0.95 of requests meeting ttft<=400 ms and tpot<=25 ms" in stdout, err
    row = pl.read_parquet(out / "plan.parquet").filter(pl.col("how") == "simulated").row(0, named=True)
    args = shlex.split(row["simulate_args"])
    assert args[args.index("--goodput") + 1] == "ttft:400 tpot:25"
    summary = slo_values(tmp_path, args, capsys)
    assert summary["good_requests"] / summary["completed"] >= 0.95
    assert row["slo_attainment"] == summary["good_requests"] / summary["completed"]


def test_pools_are_searched_on_every_gpu_type_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu h100_sxm,h200_sxm: the decode pool of each GPU's prefill servers is searched on both
    (aiconfigurator's --decode-system); a mixed pool is priced by its two GPUs' hourly costs and its
    rerun line names the decode GPU; an H200 decode pool decodes faster than an H100 one."""
    rows, stdout = plan_rows(tmp_path, capsys, "--policy", "chunked", "--max-num-batched-tokens", "512",
                             "--router", "round-robin", "--gpu", "h100_sxm,h200_sxm", "--exhaustive",
                             "--gpu-hourly-cost", "h100_sxm=2", "--gpu-hourly-cost", "h200_sxm=3")
    pools = rows.filter(pl.col("kind") == "disaggregated")
    combos = {(r["gpu"], r["decode_gpu"]) for r in pools.iter_rows(named=True)}
    assert combos == {("h100_sxm", None), ("h100_sxm", "h200_sxm"), ("h200_sxm", None), ("h200_sxm", "h100_sxm")}
    mixed = pools.filter(pl.col("decode_gpu") == "h200_sxm").row(0, named=True)
    same = pools.filter(pl.col("gpu") == "h100_sxm", pl.col("decode_gpu").is_null()).row(0, named=True)
    assert mixed["gpus"] == 2 and mixed["viable"]
    # USD 2 + USD 3 an hour for the output tokens of two GPUs.
    tokens = mixed["tokens_per_s_per_gpu"] * 2
    assert mixed["cost_per_million_tokens"] == pytest.approx(5 / 3600 / tokens * 1e6, rel=1e-12)
    assert "--decode-gpu h200_sxm" in mixed["simulate_args"]
    assert mixed["p90_tpot_ms"] < same["p90_tpot_ms"]
    assert "decode on h200_sxm" in stdout


def test_executor_ray_is_refused_in_one_line_without_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    code, _, err = simulate_cli(["plan", *SMALL, "--executor", "ray", "--out", str(tmp_path / "p")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--executor ray needs Ray, which is not installed" in err and "Traceback" not in err
    code, _, err = simulate_cli(["plan", *SMALL, "--address", "auto", "--out", str(tmp_path / "q")], capsys)
    assert code == 2 and "--address 'auto' is a Ray cluster's: it needs --executor ray" in err


def test_a_plan_on_ray_finds_what_it_finds_locally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exhaustive, so that no skip depends on which deployments finished first."""
    pytest.importorskip("ray")
    args = ["--policy", "chunked", "--max-num-batched-tokens", "512", "--router", "round-robin", "--exhaustive"]
    local, _ = plan_rows(tmp_path / "local", capsys, *args)
    on_ray, _ = plan_rows(tmp_path / "ray", capsys, *args, "--executor", "ray")
    columns = ["deployment", "max_rate", "max_rate_high", "how", "simulate_args"]
    assert on_ray.select(columns).sort("deployment").equals(local.select(columns).sort("deployment"))
    assert local["how"].str.contains("simulated").any()


def test_a_space_every_server_of_which_is_refused_is_one_line_and_no_folder(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # A budget of fewer tokens than --max-num-seqs is refused per server (vLLM refuses it); when that
    # leaves no server there is nothing to plan, and the error names the values, before any output.
    out = tmp_path / "p"
    code, _, err = simulate_cli(["plan", *SMALL, "--policy", "chunked", "--max-num-seqs", "8",
                                 "--max-num-batched-tokens", "4", "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "8 > 4 with --policy chunked" in err and "Traceback" not in err
    assert not out.exists()
