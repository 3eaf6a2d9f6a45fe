"""Each recipe of docs/agents.md, run for real: the agent installed as the recipe says, one short
two-turn conversation against `agl-bridge serve --model tiny`, and the recording checked.

The agent programs are `examples/agents/*.py`, run the way the runner runs an `AgentCommand` (its
environment: `OPENAI_BASE_URL` routed to the rollout attempt, `OPENAI_API_KEY`, `AGL_MODEL`,
`AGL_TASK`). Between the agent and the server sits `HttpTap`, so the test sees every request and its
status. What is asserted is what the product controls (agent_checks.py); the random model's words
may make an agent give up early, which is no failure of ours unless a recipe says the agent copes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agent_checks import (
    check_call_classes,
    check_multi_turn,
    check_reached_and_answered,
    check_recorded,
    check_sampled_on,
    continuations,
    count_all_calls,
    model_requests,
    stored_calls,
)
from agent_installs import CACHE_ROOT, NPM_AGENTS, PIP_AGENTS, ensure_npm_agent, ensure_pip_agent
from agent_server import AgentServer
from shared_helpers import REPO, new_id

from agl_bridge.runner import AgentCommand
from agl_bridge.runner.endpoint import Endpoint
from agl_bridge.types import LLMCall

EXAMPLES = REPO / "examples" / "agents"
TASK = {"turns": ["What is 2 + 3? Use the add tool.", "Now add 4 to that."]}
AGENT_TIMEOUT_S = 900


@dataclass(frozen=True)
class Recipe:
    """One agent of docs/agents.md: its program, how it is installed, the route it must use."""

    name: str
    script: str  # in examples/agents/
    install: str | None  # a key of PIP_AGENTS or NPM_AGENTS; None: our own dev install
    route: str  # the path every model request must end with (the protocol the agent speaks)
    args: tuple[str, ...] = ()
    multi_turn: bool = True
    exits_cleanly: bool = True  # False where the random model's output can make the agent raise
    env: dict[str, str] = field(default_factory=dict)
    marks: tuple[Any, ...] = ()

    def param(self) -> Any:
        return pytest.param(self, id=self.name, marks=[pytest.mark.slow, *self.marks])


RECIPES = [
    Recipe("claude-code", "claude_code.py", "claude-code", "/v1/messages"),
    Recipe("codex", "codex_cli.py", "codex", "/v1/responses"),
    Recipe("opencode", "opencode_agent.py", "opencode", "/v1/chat/completions"),
    Recipe("openai-agents-responses", "openai_agents_sdk.py", "openai-agents", "/v1/responses", ("--api", "responses")),
    Recipe("openai-agents-chat", "openai_agents_sdk.py", "openai-agents", "/v1/chat/completions", ("--api", "chat")),
    Recipe("langgraph", "langgraph_agent.py", None, "/v1/chat/completions"),
    Recipe("pydantic-ai", "pydantic_ai_agent.py", "pydantic-ai", "/v1/chat/completions"),
    Recipe("smolagents", "smolagents_agent.py", "smolagents", "/v1/chat/completions"),
    Recipe("google-adk", "google_adk_agent.py", "google-adk", "/v1/chat/completions"),
    # DSPy renders every prompt afresh (history becomes fields of a new prompt): calls never extend one
    # another. It raises when a reply has none of its `[[ ## answer ## ]]` fields, as the random model's never do.
    Recipe("dspy", "dspy_agent.py", "dspy", "/v1/chat/completions", multi_turn=False, exits_cleanly=False),
    Recipe("autogen", "autogen_agent.py", "autogen", "/v1/chat/completions"),
    Recipe("crewai", "crewai_agent.py", None, "/v1/chat/completions"),
    # mini-swe-agent drops a reply it cannot parse (every reply of the random model) from the conversation
    # and appends its format error instead: the next prompt holds the last one's messages, never its reply.
    Recipe("mini-swe-agent", "mini_swe_agent.py", "mini-swe-agent", "/v1/chat/completions", multi_turn=False),
    # The same agents configured to meet the protocol edges issue 16 fixed (previous_response_id, reasoning effort).
    Recipe(
        "openai-agents-previous-response-id",
        "openai_agents_sdk.py",
        "openai-agents",
        "/v1/responses",
        ("--api", "responses", "--server-history"),
    ),
    Recipe(
        "openai-agents-reasoning-effort",
        "openai_agents_sdk.py",
        "openai-agents",
        "/v1/responses",
        ("--api", "responses", "--reasoning-effort", "low"),
    ),
    Recipe(
        "langgraph-reasoning-effort",
        "langgraph_agent.py",
        None,
        "/v1/chat/completions",
        ("--reasoning-effort", "low"),
    ),
]


def _command(recipe: Recipe) -> tuple[list[str], dict[str, str]]:
    """The agent's argv (installing the agent first) and the environment its install needs."""
    script = str(EXAMPLES / recipe.script)
    if recipe.install in NPM_AGENTS:
        executable = ensure_npm_agent(NPM_AGENTS[recipe.install])
        return [sys.executable, script, *recipe.args], {"PATH": f"{executable.parent}{os.pathsep}{os.environ['PATH']}"}
    if recipe.install in PIP_AGENTS:
        # The agent's own venv: nothing of ours on its path, as on a user's machine.
        return [str(ensure_pip_agent(PIP_AGENTS[recipe.install])), script, *recipe.args], {"PYTHONPATH": ""}
    return [sys.executable, script, *recipe.args], {}


def _isolated_home(root: Path) -> dict[str, str]:
    """A fresh home for the agent: no user configuration read, nothing written outside the test."""
    home = root / "home"
    (home / ".codex").mkdir(parents=True)
    return {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "CODEX_HOME": str(home / ".codex"),
        # opencode installs its plugin SDK from npm into its config folder on first start: keep that one.
        "OPENCODE_CONFIG_DIR": str(CACHE_ROOT / "opencode-config"),
    }


@dataclass(frozen=True)
class Conversation:
    """One run of a recipe's agent in a rollout of its own: its exit, its requests, the calls recorded."""

    result: subprocess.CompletedProcess[str]
    rollout_id: str
    attempt_id: str
    exchanges: list[Any]
    calls: list[LLMCall]
    recorded_elsewhere: int  # calls the store gained outside this rollout meanwhile

    @property
    def prefix(self) -> str:
        return f"/rollout/{self.rollout_id}/attempt/{self.attempt_id}"

    @property
    def cut(self) -> bool:
        """A reply the random model ran to its token limit (see CONVERSATION_TRIES)."""
        return any(call.finish_reason == "length" for call in self.calls)

    def cut_short(self) -> bool:
        """A reply was cut and the agent gave up before a second turn."""
        return self.cut and self.result.returncode != 0 and not continuations(self.calls)


def _converse(recipe: Recipe, agent_server: AgentServer, root: Path) -> Conversation:
    """Runs the recipe's agent through the two-turn task, in a fresh home under `root`."""
    argv, install_env = _command(recipe)
    rollout_id, attempt_id = new_id(f"ro-{recipe.name}"), new_id("at")
    origin = agent_server.tap.origin
    endpoint = Endpoint(
        base_url=f"{origin}/rollout/{rollout_id}/attempt/{attempt_id}/v1",
        api_key=agent_server.api_key,
        model="tiny",
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        server_url=origin,
    )
    env = AgentCommand(argv).environment(TASK, endpoint)
    env.update(install_env)
    env.update(_isolated_home(root))
    env.update(recipe.env)
    workdir = root / "work"
    workdir.mkdir(parents=True)
    seen, recorded_before = len(agent_server.tap), count_all_calls(agent_server.store)
    result = subprocess.run(
        argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S
    )
    calls = stored_calls(agent_server.store, rollout_id)
    recorded_elsewhere = count_all_calls(agent_server.store) - recorded_before - len(calls)
    return Conversation(result, rollout_id, attempt_id, agent_server.tap.since(seen), calls, recorded_elsewhere)


CONVERSATION_TRIES = 3
"""A first reply the random model runs to its token limit ends some agents' conversation (the Agents SDK
raises on an `incomplete` Responses answer, as OpenAI sends it). That is the model's words, not the
product, so the conversation is held again, in a new rollout, until one reaches its second turn."""


@pytest.mark.parametrize("recipe", [recipe.param() for recipe in RECIPES])
def test_agent_recipe(
    recipe: Recipe, agent_server: AgentServer, tiny_scorer: Any, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    for attempt in range(CONVERSATION_TRIES):
        conversation = _converse(recipe, agent_server, tmp_path / f"conversation-{attempt}")
        if not (recipe.multi_turn and conversation.cut_short()):
            break
        print(f"{recipe.name}: the random model's first reply ran to the token limit and ended the conversation")
    result, exchanges, calls = conversation.result, conversation.exchanges, conversation.calls
    prefix = conversation.prefix
    print(  # shown with -s: what the agent did, for docs/agents.md's table
        f"{recipe.name}: exit {result.returncode}, {len(exchanges)} requests, {len(calls)} calls, prompt lengths "
        f"{[len(c.prompt_token_ids) for c in calls]}, continued turns {len(continuations(calls))}, fields sent "
        f"{sorted({key for e in model_requests(exchanges) for key in e.request_json()})}, routes "
        f"{sorted({f'{e.method} {e.path.removeprefix(prefix)}' for e in exchanges})}"
    )
    try:
        check_reached_and_answered(exchanges, prefix + "/")
        wrong_route = [e.describe() for e in model_requests(exchanges) if not e.path.endswith(recipe.route)]
        assert not wrong_route, f"{recipe.name} should speak {recipe.route} only: {wrong_route}"
        check_recorded(calls, exchanges, conversation.rollout_id, conversation.attempt_id)
        assert not conversation.recorded_elsewhere, "calls recorded outside the rollout"
        check_sampled_on(calls, tiny_scorer)
        if recipe.exits_cleanly and not conversation.cut:  # a cut reply may make an agent raise
            assert result.returncode == 0, f"{recipe.name} failed"
        if recipe.multi_turn and (edited := check_multi_turn(calls, tiny_tokenizer.decode)):
            print(f"{recipe.name}: calls {edited} continue a reply the agent changed before sending it back")
        print(f"{recipe.name}: call classes {check_call_classes(calls)}")
    except AssertionError as error:
        transcript = (
            f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-5000:]}"
        )
        raise AssertionError(f"{error}\n\nthe agent's {transcript}") from None
