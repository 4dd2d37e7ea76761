"""The flags and settings surface: values outside their physical range, sizes past the machine,
settings that do nothing and outputs that cannot be written are refused in one line naming the flag
as typed, before anything runs; nothing hangs; a sweep file's value meets the same check as a flag's."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest
from test_cli import simulate_cli

from simulator.cli.sweep_command import kept_up
from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.run import estimate
from simulator.run.estimate import check_batch_table, check_run_size

SMALL = ["--num-requests", "20", "--input-len", "300", "--output-len", "20"]
HANG = 120
"""Seconds after which a command that should end at once is taken to hang."""


def one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = simulate_cli(args, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    assert len(err) <= 300, err
    return err.strip()


def in_a_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`simulate ARGS` in its own process, which must end within `HANG` seconds."""
    return subprocess.run([sys.executable, "-c", "from simulator.cli.main import run; run()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=HANG)


@pytest.mark.parametrize("share", ["0", "-0.5", "nan"])
@pytest.mark.parametrize("verb", [[], ["batch-table", "--batch", "1"]])
def test_a_memory_share_outside_0_1_ends_at_once_in_one_line(share: str, verb: list[str], tmp_path: Path) -> None:
    done = in_a_process([*verb, "--gpu-memory-utilization", share], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "--gpu-memory-utilization" in done.stderr
    assert "nan GB" not in done.stderr and "try --tensor-parallel-size" not in done.stderr


def test_a_sweep_with_a_memory_share_of_0_ends_at_once_before_any_configuration(tmp_path: Path) -> None:
    out = tmp_path / "sweep.parquet"
    done = in_a_process(["sweep", "--gpu-memory-utilization", "0.9,0", *SMALL, "--out", str(out)], tmp_path)
    assert done.returncode == 2 and "--gpu-memory-utilization" in done.stderr and "got 0.0" in done.stderr
    assert not out.exists()


def test_the_weights_check_ends_on_a_gpu_of_no_memory() -> None:
    code = ("from simulator.deploy.memory import check_weights_fit\n"
            "from simulator.deploy.model import load_model\n"
            "try:\n"
            "    check_weights_fit(load_model('llama-3.1-8b'), 1, 0, 0.9)\n"
            "except ValueError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    assert "more than the 0.0 GB usable" in done.stdout and "try --tensor-parallel-size" not in done.stdout


@pytest.mark.parametrize(("args", "named"), [
    (["--max-queue-delay", "1e308", "--policy", "static"], "--max-queue-delay"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-transfer-bandwidth", "1e-300"],
     "--kv-transfer-bandwidth"),
    (["--input-len", str(2**63)], "--input-len"),
    (["--random-input-len", str(2**63)], "--random-input-len"),
    (["--duration", "1e308", "--rate", "1"], "--duration"),
    (["--num-turns", "2", "--think-time", "1e308"], "--think-time"),
    (["--num-prompts", "1e3"], "--num-prompts"),
    (["--request-rate", "nan"], "--request-rate"),
    (["--seed", str(2**64)], "--seed"),
    (["--time-limit", "inf"], "--time-limit"),
    (["--num-replicas", "100000000"], "--num-replicas"),
    (["--goodput", "ttft:1e308"], "--goodput"),
])
def test_an_absurd_number_is_refused_naming_the_flag_as_typed(args: list[str], named: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning on the way
        err = one_line([*SMALL, *args, "--out", str(tmp_path / "run")], capsys)
    assert err.startswith(f"error: {named} ") and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("args", "named"), [
    (["--num-requests", "20,1e308"], "--num-requests"), (["--duration", "1e308", "--rate", "1"], "--duration"),
    (["--input-len", f"300,{2**63}"], "--input-len"), (["--jobs", "100000000"], "--jobs"), (["--jobs", "0"], "--jobs"),
])
def test_an_absurd_sweep_value_is_refused_before_any_configuration(args: list[str], named: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    assert one_line(["sweep", *args, "--out", str(out)], capsys).startswith(f"error: {named} must be ")
    assert not out.exists()


def test_a_huge_value_is_quoted_in_at_most_80_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line(["--input-len", "7" * 10_000, "--out", str(tmp_path / "run")], capsys)
    assert err.endswith("...'") or err.endswith("..."), err
    assert len(err.partition("got ")[2]) <= 80


@pytest.mark.parametrize("flag", ["--policy", "--cost", "--router", "--quantization", "--kv-cache-dtype"])
def test_an_unknown_name_is_quoted_in_at_most_80_characters(flag: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line([flag, "x" * 5000, "--out", str(tmp_path / "run")], capsys)
    assert err.startswith(f"error: unknown {flag} 'xxx") and "(choose from " in err
    quoted = err.removeprefix(f"error: unknown {flag} ").partition(" (choose from ")[0]
    assert len(quoted) <= 80, quoted


def test_a_sweep_file_value_gets_the_line_the_flag_gets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text("[fixed]\nmax_queue_delay = 1e308\npolicy = 'static'\n")
    from_file = one_line(["sweep", "--file", str(spec), "--out", str(tmp_path / "s.parquet")], capsys)
    from_flag = one_line(["--policy", "static", "--max-queue-delay", "1e308"], capsys)
    assert from_file == from_flag
    spec.write_text("[axes]\ninput_len = [true, 300]\n")  # a bool is no number of tokens
    assert "--input-len" in one_line(["sweep", "--file", str(spec), "--out", str(tmp_path / "s.parquet")], capsys)
    spec.write_text(f"[axes]\ninput_len = [300, {2**63 - 1}]\n")
    assert "--input-len" in one_line(["sweep", "--file", str(spec), "--out", str(tmp_path / "s.parquet")], capsys)


@pytest.mark.parametrize("args", [["--burstiness", "0.5"], ["--rate", "inf", "--burstiness", "0.5"]])
def test_burstiness_without_a_finite_rate_is_refused(args: list[str], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line([*args, "--out", str(tmp_path / "run")], capsys)
    assert "--burstiness 0.5" in err and "finite --rate" in err


def test_burstiness_with_a_rate_still_runs() -> None:
    assert RunConfig(rate=4.0, burstiness=0.5).burstiness == 0.5


def test_a_seed_beside_a_trace_is_refused_unless_something_draws_from_it(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n")
    with pytest.raises(InputError, match=r"^--seed 3 seeds nothing beside --trace"):
        RunConfig(trace=str(trace), seed=3)
    # Priorities and the random router draw from the seed: there it means something.
    RunConfig(trace=str(trace), seed=3, priority_levels=2, policy="priority")
    RunConfig(trace=str(trace), seed=3, num_replicas=2, router="random")


@pytest.mark.parametrize("name", ["../../x.json", "/tmp/servesim-outside.json", "."])
def test_a_result_file_outside_the_result_dir_is_refused_before_the_run(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    inside = tmp_path / "a" / "b"
    inside.mkdir(parents=True)
    monkeypatch.chdir(inside)
    err = one_line(["--save-result", "--result-filename", name, *SMALL, "--out", str(tmp_path / "run")], capsys)
    assert "--result-filename" in err and "--result-dir" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "x.json").exists()


def test_a_result_file_name_the_file_system_refuses_is_refused_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line(["--save-result", "--result-dir", str(tmp_path), "--result-filename", "a" * 300, *SMALL,
                    "--out", str(tmp_path / "run")], capsys)
    assert "--result-filename 'aaa" in err and "too long" in err
    assert not (tmp_path / "run").exists()


def test_an_unwritable_result_dir_is_refused_before_the_run(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("mine")
    err = one_line(["--save-result", "--result-dir", str(tmp_path / "a-file" / "results"), *SMALL,
                    "--out", str(tmp_path / "run")], capsys)
    assert "--result-dir" in err and "not a folder" in err
    assert not (tmp_path / "run").exists()


def test_a_result_file_in_a_folder_inside_the_result_dir_is_written(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = simulate_cli(["--save-result", "--result-dir", str(tmp_path), "--result-filename", "sub/r.json",
                                 *SMALL, "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert (tmp_path / "sub" / "r.json").is_file()


@pytest.fixture
def machine_of_64_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate's machine, whatever this one holds."""
    monkeypatch.setattr(estimate, "machine_memory_bytes", lambda: 64 * 10**9)


@pytest.mark.usefixtures("machine_of_64_gb")
@pytest.mark.parametrize(("args", "named"), [
    (["--num-requests", "1000000000", "--rate", "10"], "--num-requests 1000000000"),
    (["--num-prompts", "1000000000", "--rate", "10"], "--num-prompts 1000000000"),
    (["--rate", "1000", "--duration", "1000000"], "--duration 1e+06 at --rate 1000"),
    (["--num-requests", "100000", "--output-len", "10000000"], "--num-requests 100000 with --output-len 10000000"),
])
def test_a_run_past_the_machine_is_refused_before_it_is_built(args: list[str], named: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line([*args, "--out", str(tmp_path / "run")], capsys)
    assert err.startswith(f"error: {named} asks for ") and "past this machine's 64.0 GB" in err and "--force" in err


@pytest.mark.usefixtures("machine_of_64_gb")
def test_force_lets_a_run_past_the_estimate_through() -> None:
    config = RunConfig(num_requests=10**9, rate=10.0)
    with pytest.raises(InputError, match="--force"):
        check_run_size(config, token_rows=False, force=False)
    said = check_run_size(config, token_rows=False, force=True)
    assert said.requests == 10**9 and said.steps >= 10**9 * 300 // 1024 and said.bytes > 64 * 10**9


def test_the_estimate_is_a_lower_bound_of_what_a_run_makes(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = RunConfig(rate=20.0, num_requests=40, input_len=300, output_len=30)
    said = estimate.estimate_run(config, token_rows=True)
    code, _, _ = simulate_cli(["--rate", "20", "--num-requests", "40", "--input-len", "300", "--output-len", "30",
                               "--out", str(tmp_path / "run")], capsys)
    assert code == 0
    steps = pl.read_parquet(tmp_path / "run" / "steps.parquet").height
    tokens = pl.read_parquet(tmp_path / "run" / "tokens.parquet").height
    assert said.requests == 40 and said.token_rows == tokens and 30 <= said.steps <= steps


def test_a_sweep_past_the_machine_is_refused_before_any_configuration_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(estimate, "machine_memory_bytes", lambda: 10**5)  # less than 1000 requests hold
    out = tmp_path / "sweep.parquet"
    args = ["sweep", "--num-requests", "20,1000", "--input-len", "300", "--output-len", "20", "--rate", "20",
            "--jobs", "1", "--out", str(out)]
    err = one_line(args, capsys)
    assert "configuration " in err and "--num-requests 1000 asks for" in err and "--force" in err
    assert not out.exists()
    code, stdout, _ = simulate_cli([*args, "--force"], capsys)
    assert code == 0 and "2 run now" in stdout


def test_a_batch_table_past_a_step_s_physical_size_is_refused() -> None:
    with pytest.raises(InputError, match=r"^--batch must be an integer in \[1, 10000000\] sequences, got 1000000000$"):
        check_batch_table(2300, [1, 10**9])
    with pytest.raises(InputError, match=r"^--context must be an integer"):
        check_batch_table(2**63, [1])
    check_batch_table(2300, [1, 10**7])  # the largest batch the chapter's table takes


def test_a_sweep_prints_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.parquet"
    code, stdout, _ = simulate_cli(["sweep", "--rate", "4,inf", "--policy", "chunked", "--max-num-batched-tokens",
                                    "256,4096", "--max-num-seqs", "64", *SMALL, "--jobs", "1", "--out", str(out)],
                                   capsys)
    assert code == 0
    header, *lines = stdout.splitlines()[1:]
    assert header.split() == ["max_num_batched_tokens", "rate", "req/s", "p99", "TTFT", "ms", "p99", "TPOT", "ms",
                              "kept", "up"]
    rows = pl.read_parquet(out)
    assert len(lines) == rows.height == 4
    for line, row in zip(lines, rows.iter_rows(named=True), strict=True):
        cells = line.split()
        assert cells[:2] == [str(row["max_num_batched_tokens"]), f"{row['rate']:g}"]
        assert cells[2] == f"{row['request_throughput']:.2f}" and cells[3] == f"{row['p99_ttft'] * 1e3:.1f}"
        assert cells[5] == kept_up(row["kept_up"], row["load"])
    assert {cells.split()[5] for cells in lines} >= {"burst"}
