"""Installs each agent the way docs/agents.md says, once, into a cache, so a second test run starts at once.

- Python agents whose dependencies conflict with ours (or would weigh down every developer's
  install) get a venv of their own, built with pip from a pinned requirement and a committed lock
  (`locks/<agent>.txt`, a `pip freeze` of a first install) so CI resolves the same set every time.
- The CLI agents are npm packages, each installed into a prefix of its own.
- LangChain/LangGraph and CrewAI are in our own dev install already (pyproject.toml): no venv.

Everything lives under `$AGL_BRIDGE_CACHE/agents` (default `~/.cache/agl_bridge/agents`): venvs and
npm prefixes are named by a hash of their pins, so changing a pin builds a new one; pip's and npm's
download caches are kept there too. A file lock serialises builders (several test runs may share
the cache); a `.ready` marker, written last, tells a finished install from an interrupted one.

`python tests/agents/agent_installs.py [NAME ...]` installs ahead of the tests (all by default, four
at a time) and prints how long each took; `--lock NAME` rewrites that agent's lock from a fresh resolution.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LOCKS = Path(__file__).resolve().parent / "locks"

# Read at import (collection), before tests/conftest.py points AGL_BRIDGE_CACHE at a per-session folder:
# the agent installs must outlive a test session.
CACHE_ROOT = Path(os.environ.get("AGL_BRIDGE_CACHE") or Path.home() / ".cache" / "agl_bridge") / "agents"

INSTALL_TIMEOUT_S = 1200
PARALLEL_INSTALLS = 4


@dataclass(frozen=True)
class PipAgent:
    """A Python agent framework installed into a venv of its own."""

    name: str
    requirements: tuple[str, ...]

    @property
    def lock(self) -> Path:
        return LOCKS / f"{self.name}.txt"

    def key(self) -> str:
        lock = self.lock.read_text() if self.lock.is_file() else ""
        pins = "\n".join([*self.requirements, lock, f"python {sys.version_info[:2]}"])
        return hashlib.sha256(pins.encode()).hexdigest()[:12]

    @property
    def home(self) -> Path:
        return CACHE_ROOT / f"venv-{self.name}-{self.key()}"

    @property
    def python(self) -> Path:
        return self.home / "bin" / "python"


@dataclass(frozen=True)
class NpmAgent:
    """A CLI agent installed from npm into a prefix of its own."""

    name: str
    package: str  # name@version
    binary: str

    @property
    def home(self) -> Path:
        return CACHE_ROOT / f"npm-{self.name}-{hashlib.sha256(self.package.encode()).hexdigest()[:12]}"

    @property
    def executable(self) -> Path:
        return self.home / "node_modules" / ".bin" / self.binary


PIP_AGENTS: dict[str, PipAgent] = {
    agent.name: agent
    for agent in (
        PipAgent("openai-agents", ("openai-agents==0.24.0",)),
        PipAgent("pydantic-ai", ("pydantic-ai-slim[openai]==2.68.0",)),
        PipAgent("smolagents", ("smolagents[openai]==1.26.0",)),
        PipAgent("google-adk", ("google-adk[openai]==2.13.0",)),
        PipAgent("dspy", ("dspy==3.4.1",)),
        PipAgent("autogen", ("autogen-agentchat==0.7.5", "autogen-ext[openai]==0.7.5")),
        PipAgent("mini-swe-agent", ("mini-swe-agent==2.4.6",)),
    )
}

NPM_AGENTS: dict[str, NpmAgent] = {
    agent.name: agent
    for agent in (
        NpmAgent("claude-code", "@anthropic-ai/claude-code@2.1.331", "claude"),
        NpmAgent("codex", "@openai/codex@0.169.0", "codex"),
        NpmAgent("opencode", "opencode-ai@1.18.33", "opencode"),
    )
}


class AgentInstallError(RuntimeError):
    """An agent could not be installed; the message has the installer's output tail."""


def install_env() -> dict[str, str]:
    """The environment pip and npm run in: their download caches under CACHE_ROOT, no update checks."""
    return {
        **os.environ,
        "PIP_CACHE_DIR": str(CACHE_ROOT / "pip-cache"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "npm_config_cache": str(CACHE_ROOT / "npm-cache"),
        "npm_config_update_notifier": "false",
        "npm_config_fund": "false",
        "npm_config_audit": "false",
    }


def _run(command: list[str]) -> None:
    result = subprocess.run(
        command, env=install_env(), capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise AgentInstallError(f"{' '.join(command)} exited with {result.returncode}:\n{output}")


@contextmanager
def _build_lock(home: Path) -> Iterator[bool]:
    """Hold the builder lock for `home`; yields whether the install is already complete."""
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield (home / ".ready").is_file()


def _base_python() -> str:
    """The interpreter new venvs are made from: the one under the running venv, if any."""
    return getattr(sys, "_base_executable", sys.executable)


def ensure_pip_agent(agent: PipAgent) -> Path:
    """The agent venv's python, building the venv first if it is missing (pinned by its lock)."""
    with _build_lock(agent.home) as ready:
        if not ready:
            shutil.rmtree(agent.home, ignore_errors=True)
            _run([_base_python(), "-m", "venv", str(agent.home)])
            pip = [str(agent.python), "-m", "pip", "install", "--quiet", "--no-compile"]
            constraints = ["-c", str(agent.lock)] if agent.lock.is_file() else []
            _run([*pip, *constraints, *agent.requirements])
            (agent.home / ".ready").write_text("\n".join(agent.requirements) + "\n")
    return agent.python


def ensure_npm_agent(agent: NpmAgent) -> Path:
    """The CLI's executable, installing the pinned npm package first if it is missing."""
    with _build_lock(agent.home) as ready:
        if not ready:
            shutil.rmtree(agent.home, ignore_errors=True)
            agent.home.mkdir(parents=True)
            _run(["npm", "install", "--prefix", str(agent.home), "--no-save", agent.package])
            (agent.home / ".ready").write_text(agent.package + "\n")
    return agent.executable


def write_lock(agent: PipAgent) -> None:
    """Resolve the agent's requirements afresh in a scratch venv and write what pip chose to its lock."""
    scratch = CACHE_ROOT / f"lock-{agent.name}"
    shutil.rmtree(scratch, ignore_errors=True)
    _run([_base_python(), "-m", "venv", str(scratch)])
    python = str(scratch / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", *agent.requirements])
    frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    LOCKS.mkdir(exist_ok=True)
    agent.lock.write_text(
        f"# pip freeze of {' '.join(agent.requirements)} (tests/agents/agent_installs.py --lock)\n{frozen}"
    )
    shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--lock"]:
        for name in argv[1:] or list(PIP_AGENTS):
            write_lock(PIP_AGENTS[name])
            print(f"locked {name}: {PIP_AGENTS[name].lock}")
        return

    def install(name: str) -> None:
        started = time.monotonic()
        where = ensure_pip_agent(PIP_AGENTS[name]) if name in PIP_AGENTS else ensure_npm_agent(NPM_AGENTS[name])
        print(f"{name}: {where} ({time.monotonic() - started:.1f} s)", flush=True)

    # Installs mostly wait on downloads: four at once took 8 min cold where one at a time took 11 (loaded machine).
    with ThreadPoolExecutor(max_workers=PARALLEL_INSTALLS) as pool:
        list(pool.map(install, argv or [*PIP_AGENTS, *NPM_AGENTS]))


if __name__ == "__main__":
    main(sys.argv[1:])
