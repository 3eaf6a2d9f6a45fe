"""Which model answers: the deterministic answerer as a CrewAI LLM, or any model by configuration.

The answerer is an ordinary CrewAI Agent; only its LLM changes:
  - `offline` (the default): `OfflineAnswererLLM`, a CrewAI custom LLM that reads the secret and
    the question from its prompt and answers from the attribute table — no network, deterministic;
  - a hosted model (e.g. `openai/gpt-4o-mini` with OPENAI_API_KEY set), called directly;
  - `via_proxy`: a model name from the proxy's LiteLLM config (`agl-bridge serve --litellm-config`),
    called through the rollout's base_url, so its calls are recorded in the rollout as text-only.
A configuration that cannot work (a hosted model without a key) gives no LLM: every question is
then answered "n/a" (a wasted turn), and the game goes on.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from crewai import LLM, BaseLLM

from twenty_q.answerer import DeterministicAnswerer

logger = logging.getLogger(__name__)

OFFLINE = "offline"
SECRET_LINE = re.compile(r"^Secret: (.+)$", re.MULTILINE)
QUESTION_LINE = re.compile(r"^Question: (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class AnswererConfig:
    """How to reach the answerer model; `from_env()` reads TWENTYQ_ANSWERER_* variables."""

    model: str = OFFLINE
    base_url: str | None = None
    api_key: str | None = None
    via_proxy: bool = False

    @classmethod
    def from_env(cls) -> AnswererConfig:
        """TWENTYQ_ANSWERER_MODEL / _BASE_URL / _API_KEY / _VIA_PROXY (1/true), default offline."""
        return cls(
            model=os.environ.get("TWENTYQ_ANSWERER_MODEL") or OFFLINE,
            base_url=os.environ.get("TWENTYQ_ANSWERER_BASE_URL") or None,
            api_key=os.environ.get("TWENTYQ_ANSWERER_API_KEY") or None,
            via_proxy=(os.environ.get("TWENTYQ_ANSWERER_VIA_PROXY") or "").lower() in ("1", "true", "yes"),
        )


class LocalLLM(BaseLLM):
    """A CrewAI custom LLM computed in this process: no native tool calls, no stop words, any prompt length."""

    def supports_function_calling(self) -> bool:
        """No native tool calls: CrewAI uses its text format."""
        return False

    def supports_stop_words(self) -> bool:
        """The reply is computed whole; there is nothing to stop."""
        return False

    def get_context_window_size(self) -> int:
        """Large enough for any prompt CrewAI builds here."""
        return 32_768


class OfflineAnswererLLM(LocalLLM):
    """A CrewAI LLM that answers from the attribute table, in CrewAI's "Final Answer:" format."""

    def __init__(self, answerer: DeterministicAnswerer | None = None) -> None:
        super().__init__(model="twenty-questions-offline-answerer", temperature=0.0)
        self.answerer = answerer or DeterministicAnswerer()
        self.calls = 0

    def call(
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        """Read "Secret: ..." and "Question: ..." from the prompt and answer them as JSON."""
        self.calls += 1
        text = messages if isinstance(messages, str) else "\n".join(str(m.get("content") or "") for m in messages)
        secret, question = SECRET_LINE.findall(text), QUESTION_LINE.findall(text)
        if not secret or not question:
            raise ValueError("the answerer prompt must carry 'Secret: ...' and 'Question: ...' lines")
        response = self.answerer.answer(secret[-1].strip(), question[-1].strip())
        return f"Thought: I checked the question against what I know.\nFinal Answer: {response.model_dump_json()}"


def make_answerer_llm(config: AnswererConfig, endpoint: Any | None = None) -> BaseLLM | None:
    """The answerer's LLM for one game, or None when the configuration cannot work (warned)."""
    if config.model == OFFLINE:
        return OfflineAnswererLLM()
    if config.via_proxy:
        if endpoint is None:
            logger.warning("answerer %r is configured via the proxy, but this game has no proxy endpoint", config.model)
            return None
        return LLM(
            model=f"openai/{config.model}", base_url=endpoint.base_url, api_key=endpoint.api_key, temperature=0.0
        )
    key = config.api_key
    if key is None and config.model.startswith("openai/") and config.base_url is None:
        key = os.environ.get("OPENAI_API_KEY")
        if not key:
            logger.warning(
                "answerer %r needs OPENAI_API_KEY (or TWENTYQ_ANSWERER_API_KEY); questions get n/a", config.model
            )
            return None
    try:
        return LLM(model=config.model, base_url=config.base_url, api_key=key, temperature=0.0)
    except Exception as error:  # a bad model name must cost turns, not the rollout
        logger.warning("answerer %r cannot be set up (%s); questions get n/a", config.model, error)
        return None
