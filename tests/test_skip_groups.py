"""The suite says what it skipped: one line per group with its command; under CI=true such a skip fails.

Runs a small inner pytest session with this suite's conftest (its hooks) on tests that skip for
each kind of reason, as `scripts/test.sh` would, with and without CI=true. And the README says
what `.ci/run` sets up in `.ci/run`'s own words.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from shared_helpers import REPO
from skip_groups import SKIP_GROUPS, skip_group, summary_lines

SKIPPING = """
import pytest

def test_vllm_one():
    pytest.skip("the vLLM venv is not built (/x): run bash scripts/vllm_env.sh")

def test_vllm_two():
    pytest.skip("the vLLM venv is not built (/x): run bash scripts/vllm_env.sh")

@pytest.mark.skipif(True, reason="root writes into read-only directories anyway")
def test_as_root():
    pass

def test_runs():
    pass
"""


def run_inner(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(SKIPPING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]), "CI": "true" if ci else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # an inner pytest session
def test_the_end_of_a_run_names_each_skipped_group_and_its_command(tmp_path: Path) -> None:
    result = run_inner(tmp_path, ci=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "skipped, and how to run them" in result.stdout
    assert "vLLM tests: 2 skipped — run `bash scripts/vllm_env.sh` first" in result.stdout
    assert "Tests that cannot hold here: 1 skipped" in result.stdout


@pytest.mark.slow  # an inner pytest session
def test_under_ci_a_skip_of_what_ci_provides_fails_the_run(tmp_path: Path) -> None:
    result = run_inner(tmp_path, ci=True)
    assert result.returncode == 1, result.stdout[-3000:]
    assert result.stdout.count("CI=true must not skip vLLM tests") >= 2
    assert "2 failed, 1 passed, 1 skipped" in result.stdout  # the root-only premise still just skips


def test_every_reason_the_suite_gives_finds_its_group() -> None:
    reasons = {
        "the vLLM venv is not built (/root/.cache/vllm): run bash scripts/vllm_env.sh": "vLLM tests",
        "the tinker-cookbook site is not built (/x): run bash scripts/tinker_cookbook_env.sh": "tinker-cookbook tests",
        "no Chromium at /usr/bin/chromium: install Debian's chromium (apt-get install -y chromium)": "Browser tests",
        "playwright is not installed (pip install -e '.[dev]')": "Python extras tests",
        "no PostgreSQL server can run here: no PostgreSQL server binaries (initdb, pg_ctl) found": "PostgreSQL tests",
        "the Ray runner's tests need Ray: pip install 'agl-bridge[ray]'": "Python extras tests",
        "could not import 'langchain_openai': No module named 'langchain_openai'": "Python extras tests",
        "mini-swe-agent could not be installed (no package registry?): pip failed": "Agent install tests",
        "vLLM is not installed (pip install 'agl-bridge[vllm]'), no CUDA GPU is visible": "GPU tests",
        "root writes into read-only directories anyway": "Tests that cannot hold here",
        "vLLM is installed: the refusal cannot happen here": "Tests that cannot hold here",
    }
    for reason, name in reasons.items():
        group = skip_group(reason)
        assert group is not None and group.name == name, reason
    assert skip_group("a reason nobody grouped") is None
    assert summary_lines(["a reason nobody grouped"]) == ["other: 1 skipped — a reason nobody grouped"]
    assert {group.name for group in SKIP_GROUPS if not group.required_in_ci} == {
        "GPU tests",
        "Tests that cannot hold here",
    }


def test_the_readme_says_what_ci_sets_up_in_ci_runs_own_words() -> None:
    comment = [line.removeprefix("#").strip() for line in (REPO / ".ci" / "run").read_text().splitlines()[:12]]
    words = " ".join(line for line in comment if line)
    promise = words[words.index("as root, .ci/run installs") : words.index("fails the run.") + len("fails the run.")]
    readme = re.sub(r"\s+", " ", (REPO / "README.md").read_text())
    assert f"What CI sets up: {promise}" in readme
