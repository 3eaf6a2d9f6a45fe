"""Why tests skip, grouped, and the one command that enables each group: what the suite's end summary prints.

Every skip in the suite says why (its reason); `SKIP_GROUPS` sorts those reasons into the groups a
developer acts on — a missing vLLM venv, Chromium, PostgreSQL server, optional package — each with
the command that sets it up (the same that `.ci/run` runs). `tests/conftest.py` prints one line per
group at the end of a run, and under `CI=true` turns a skip of a group CI must provide
(`required_in_ci`) into a failure: CI never passes by skipping what it was meant to test. Skips
no setup can lift here (no CUDA GPU on a CPU machine, tests that cannot hold as root) are listed
but never fail the run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SkipGroup:
    """Skips whose reason contains one of `matches`; `enable` is the command (or step) that runs them."""

    name: str
    matches: tuple[str, ...]
    enable: str
    required_in_ci: bool = True


SKIP_GROUPS: tuple[SkipGroup, ...] = (
    SkipGroup("vLLM tests", ("vLLM venv is not built",), "run `bash scripts/vllm_env.sh` first"),
    SkipGroup(
        "tinker-cookbook tests",
        ("tinker-cookbook site is not built",),
        "run `bash scripts/tinker_cookbook_env.sh` first",
    ),
    SkipGroup(
        "Browser tests",
        ("no Chromium at",),
        "install Chromium first: `apt-get install -y chromium` (as root)",
    ),
    SkipGroup(
        "PostgreSQL tests",
        ("no PostgreSQL server can run here",),
        "install PostgreSQL's server binaries first: `apt-get install -y postgresql` (as root; the tests start "
        "a throwaway server of their own)",
    ),
    SkipGroup(
        "Python extras tests",
        ("playwright", "Ray", "langchain_openai", "No module named"),
        "run `bash scripts/setup.sh dev,postgres,ray` first",
    ),
    SkipGroup(
        "Agent install tests",
        ("could not be installed",),
        "install the agents first: `python3 tests/agents/agent_installs.py` (needs npm and a package registry)",
    ),
    SkipGroup(
        "GPU tests",
        ("CUDA",),
        "need a CUDA GPU and `pip install 'agl-bridge[vllm]'`; they cannot run on this machine",
        required_in_ci=False,
    ),
    SkipGroup(
        "Tests that cannot hold here",
        ("as root", "root writes", "cannot happen here"),
        "their premise is false on this machine (e.g. root may write read-only folders); run as another user",
        required_in_ci=False,
    ),
)
"""The groups, first match wins; a reason no group matches is listed on its own."""


def skip_group(reason: str) -> SkipGroup | None:
    """The group of a skip reason, or None if no group matches it."""
    return next((group for group in SKIP_GROUPS if any(match in reason for match in group.matches)), None)


def summary_lines(reasons: list[str]) -> list[str]:
    """One line per group (in `SKIP_GROUPS` order) and per unmatched reason: how many skipped, and how to run them."""
    counts: dict[str, int] = {}
    others: dict[str, int] = {}
    for reason in reasons:
        group = skip_group(reason)
        if group is None:
            others[reason] = others.get(reason, 0) + 1
        else:
            counts[group.name] = counts.get(group.name, 0) + 1
    lines = [
        f"{group.name}: {counts[group.name]} skipped — {group.enable}" for group in SKIP_GROUPS if group.name in counts
    ]
    lines += [f"other: {count} skipped — {reason}" for reason, count in others.items()]
    return lines
