"""The documentation: the site builds under `mkdocs build --strict` (broken links and anchors, pages
missing from the navigation and missing snippet files fail it), and every page is in the navigation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict`, run from the repository root (snippets are included relative to it)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2.0
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strict(tmp_path: Path) -> None:
    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "guides" / "writing-a-policy" / "index.html").is_file()


def copy_of_the_docs(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of docs/ to damage, and a config that is mkdocs.yml with that copy as its docs_dir."""
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\n")
    return docs, config


def warnings_of(built: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]


def test_broken_links_anchors_and_pages_left_out_of_the_nav_fail_the_build(tmp_path: Path) -> None:
    docs, config = copy_of_the_docs(tmp_path)
    with (docs / "index.md").open("a") as page:
        page.write("\n[gone](no-such-page.md) and [nowhere](index.md#no-such-anchor)\n")
    (docs / "stray-page.md").write_text("# Stray\n")
    built = mkdocs_build(config, tmp_path / "site")
    assert built.returncode != 0
    # Three warnings, each naming its defect: nothing else is wrong with the copy, so the build
    # failed for these alone. (The pages left out of the nav are listed on the lines after theirs.)
    found = warnings_of(built)
    assert len(found) == 3, found
    assert sum("no-such-page.md" in line for line in found) == 1, found
    assert sum("no-such-anchor" in line for line in found) == 1, found
    assert sum('not included in the "nav"' in line for line in found) == 1, found
    assert "stray-page.md" in built.stderr


def test_a_missing_snippet_file_fails_the_build(tmp_path: Path) -> None:
    docs, config = copy_of_the_docs(tmp_path)
    with (docs / "index.md").open("a") as page:
        page.write('\n```python\n--8<-- "policies/no_such_policy.py"\n```\n')
    built = mkdocs_build(config, tmp_path / "site")
    assert built.returncode != 0
    assert "policies/no_such_policy.py" in built.stderr, built.stderr


def nav_pages(entry: object) -> list[str]:
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in nav_pages(value)]
    if isinstance(entry, list):
        return [page for item in entry for page in nav_pages(item)]
    raise AssertionError(f"unexpected nav entry {entry!r}")


def test_every_page_is_in_the_navigation_and_every_nav_entry_is_a_page() -> None:
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert sorted(nav) == pages
