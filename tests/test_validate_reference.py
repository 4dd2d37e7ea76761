"""`simulate validate` finds vLLM's measured single-request ITL (the reference data) as the tests do,
beside the checkout, also from a copy of the package installed elsewhere (`pip install .`, not
editable), or where --reference or SERVESIM_REFERENCE says; where it finds none it says so in one
line instead of leaving the comparison out silently."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
REFERENCE = CHECKOUT.parent / "shared" / "reference"
needs_reference = pytest.mark.skipif(not (REFERENCE / "serving").is_dir(),
                                     reason=f"reference data missing: {REFERENCE}")
COMPARED = "against vLLM's measured single-request ITL"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages copied into a site folder far from the checkout, as `pip install .` leaves them."""
    site = tmp_path_factory.mktemp("site-packages")
    for package in ("simulator", "policies", "workloads", "calibration"):
        shutil.copytree(CHECKOUT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def validate(site: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = "import sys; from simulator.cli.main import run; run(['validate', *sys.argv[1:]])"
    environment = {k: v for k, v in os.environ.items() if k != "SERVESIM_REFERENCE"} | {"PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=cwd,
                          env=environment | (env or {}), timeout=300)


@needs_reference
def test_an_installed_copy_says_in_one_line_that_it_found_no_reference(installed: Path, tmp_path: Path) -> None:
    done = validate(installed, tmp_path)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "single-request ITL" in line]
    assert len(said) == 1 and said[0].startswith("no comparison with vLLM's measured single-request ITL")
    assert "--reference DIR" in said[0] and "SERVESIM_REFERENCE" in said[0]


@needs_reference
def test_an_installed_copy_finds_it_beside_the_checkout_it_runs_in_or_where_told(installed: Path,
                                                                                 tmp_path: Path) -> None:
    assert COMPARED in validate(installed, CHECKOUT).stdout  # run from the checkout: ../shared/reference
    assert COMPARED in validate(installed, tmp_path, "--reference", str(REFERENCE)).stdout
    assert COMPARED in validate(installed, tmp_path, env={"SERVESIM_REFERENCE": str(REFERENCE)}).stdout


def test_a_reference_folder_without_the_data_is_refused(installed: Path, tmp_path: Path) -> None:
    done = validate(installed, tmp_path, "--reference", str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"error: --reference {str(tmp_path)!r} holds no "
                                        "serving/vllm_blog_fp8_kv_h100.csv (give the reference data folder, "
                                        "../shared/reference beside the checkout)"]


@needs_reference
@pytest.mark.parametrize("value", ["nan", "-6.44", "0", "inf"])
def test_a_blog_table_with_an_itl_line_no_server_has_is_refused(installed: Path, tmp_path: Path, value: str) -> None:
    """The reference folder is untrusted: an intercept that is no time (NaN, negative, zero, infinite)
    printed a comparison of nan% or inf%; it is one line naming the file."""
    blog = tmp_path / "serving" / "vllm_blog_fp8_kv_h100.csv"
    blog.parent.mkdir()
    lines = (REFERENCE / "serving" / "vllm_blog_fp8_kv_h100.csv").read_text().splitlines()
    blog.write_text("\n".join(line.replace(",itl_intercept,6.44,", f",itl_intercept,{value},") for line in lines))
    done = validate(installed, tmp_path, "--reference", str(tmp_path))
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.splitlines()) == 1 and repr(str(blog)) in done.stderr and "intercept" in done.stderr
