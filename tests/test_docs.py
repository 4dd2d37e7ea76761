"""The documentation: the site builds under `mkdocs build --strict` (broken links and anchors, pages
missing from the navigation and missing snippet files fail it), every page is in the navigation, and
the README stays a short guide whose links resolve and whose quickstart prints what it shows."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# The README's two commands, word for word: install and simulate, then the whole test suite.
COMMANDS = [
    "python3.11 -m venv .venv && . .venv/bin/activate && pip install . && simulate --policy continuous --rate 12",
    'python3.11 -m venv .venv && . .venv/bin/activate && pip install ".[test]" && { pip install "torch==2.13.0+cpu" '
    '|| pip install "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu; } && python -m pytest '
    '--installed -n auto && python -m pytest -n auto',
]
MAX_README_LINES = 200


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


def code_lines(markdown: str) -> list[str]:
    """The lines inside fenced code blocks, in order."""
    lines, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def test_the_readme_is_a_short_guide_that_opens_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert code_lines(text)[:2] == COMMANDS


def relative_links(markdown: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown) + re.findall(r"^\[[^]]+\]:\s*(\S+)", markdown, re.M)
    return [target for target in targets if not re.match(r"[a-z]+:|#", target)]


def test_every_relative_link_in_the_readme_points_at_a_file() -> None:
    links = relative_links(README.read_text())
    assert links, "the README links to no page of the docs"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).exists()]
    assert not missing


def quickstart(markdown: str) -> list[tuple[str, list[str]]]:
    """The quickstart's console lines: each `$ command` with the output lines shown after it."""
    section = markdown[markdown.index("## Quickstart"):]
    section = section[:section.find("\n## ", 1)]
    runs: list[tuple[str, list[str]]] = []
    for line in code_lines(section):
        if line.startswith("$ "):
            runs.append((line[2:], []))
        else:
            runs[-1][1].append(line.rstrip())
    return runs


def test_the_readme_quickstart_prints_what_it_shows(tmp_path: Path) -> None:
    """Each command runs in a fresh folder, in order; every line shown must be printed, in that order
    ("..." alone stands for lines left out, and a line ending in " ..." for the rest of that line)."""
    runs = quickstart(README.read_text())
    assert len(runs) >= 3
    simulate = Path(sys.executable).with_name("simulate")
    for command, shown in runs:
        words = shlex.split(command)
        assert words[0] == "simulate", command
        done = subprocess.run([str(simulate), *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr)
        printed = iter(line.rstrip() for line in (done.stdout + done.stderr).splitlines())
        for line in shown:
            if line == "...":
                continue
            if line.endswith(" ..."):
                assert any(out.startswith(line[:-4]) for out in printed), (command, line)
            else:
                assert any(out == line for out in printed), (command, line)
