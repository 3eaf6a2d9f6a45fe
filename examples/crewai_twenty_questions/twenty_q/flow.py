"""The game as a CrewAI Flow: ask_question → answer_question → game_should_continue → next turn / game over.

The player is a CrewAI Agent on the trainable model. It is run with the whole conversation so far
(`Agent.kickoff(messages)`), which grows by one assistant reply and one user answer per turn: every
prompt then extends the previous prompt + reply exactly, and the player's turns merge into one
training sequence. The answerer is a CrewAI Agent with a Task whose output is structured
(`AnswererResponse`), run as a one-task Crew per question.

Failures are the game's business, never the rollout's: a reply that is not a question, a player
call that fails, an answerer that is missing or fails — each is a wasted turn, recorded in the state.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from crewai import Agent, Task
from crewai.flow.flow import Flow, listen, router, start

from twenty_q.answerer import AnswererResponse
from twenty_q.console import quiet_crewai_console
from twenty_q.prompts import (
    PLAYER_BACKSTORY,
    PLAYER_GOAL,
    PLAYER_ROLE,
    extract_question,
    feedback_message,
    opening_message,
)
from twenty_q.search import EncyclopediaSearchTool
from twenty_q.state import GameState, Turn
from twenty_q.task_outputs import answerer_crew

logger = logging.getLogger(__name__)

NEXT_TURN = "next_turn"
GAME_OVER = "game_over"

ANSWERER_TASK = """You are the answerer in a game of Twenty Questions. Answer the player's yes/no question
about the secret truthfully. Answer "n/a" when the question does not apply or cannot be answered
with yes or no. Set "correct" to true only if the question names the secret (or another name for
it). Never reveal the secret.

Secret: {secret}
Category: {category}
Question: {question}"""


class TwentyQuestionsFlow(Flow[GameState]):
    """One game of Twenty Questions between a player LLM and an answerer LLM."""

    def __init__(
        self,
        player_llm: Any,
        answerer_llm: Any | None,
        *,
        use_search: bool = True,
        player_max_iter: int = 3,
        quiet: bool = True,
        **kwargs: Any,
    ) -> None:
        self.player_llm = player_llm
        self.answerer_llm = answerer_llm
        self.search_tool = EncyclopediaSearchTool() if use_search else None
        self.player_max_iter = player_max_iter
        self.quiet = quiet
        if quiet:
            quiet_crewai_console()
        super().__init__(**kwargs)

    def _log_flow_event(self, message: str, *args: Any, **kwargs: Any) -> None:
        """CrewAI's flow log ("Flow started with ID: ..."), printed once per game unless the flow is quiet.

        CrewAI 1.6.1 prints it to stdout with no switch: learning runs play thousands of games.
        """
        if self.quiet:
            logger.debug(message)
        else:
            super()._log_flow_event(message, *args, **kwargs)

    # ------------------------------------------------------------------ the graph

    @start(NEXT_TURN)
    def ask_question(self) -> None:
        """The player's turn: one reply to the conversation so far; the question read from it (if any)."""
        state = self.state
        state.turn += 1
        if not state.messages:
            state.messages.append(
                {"role": "user", "content": opening_message(state.category, state.max_turns, state.candidates)}
            )
        reply = self._player_reply()
        question = extract_question(reply, state.candidates)
        state.history.append(Turn(number=state.turn, reply=reply, question=question, wasted=question is None))
        state.messages.append({"role": "assistant", "content": reply})

    @listen(ask_question)
    def answer_question(self) -> None:
        """The answerer's turn: answer the question (a non-question is a wasted turn), tell the player."""
        state = self.state
        turn = state.history[-1]
        if turn.question is not None:
            response = self._answer(turn.question)
            if response is None:
                turn.answer, turn.reason, turn.wasted = "n/a", "the answerer is unavailable", True
            else:
                turn.answer, turn.reason = response.yes_or_no, response.brief_reason
                state.guessed = state.guessed or response.correct
        state.messages.append(
            {"role": "user", "content": feedback_message(state.turn, state.max_turns, turn.question, turn.answer)}
        )

    @router(answer_question)
    def game_should_continue(self) -> str:
        """`game_over` once the secret is guessed or the turns are used up, else `next_turn`."""
        state = self.state
        return GAME_OVER if state.guessed or state.turn >= state.max_turns else NEXT_TURN

    @listen(GAME_OVER)
    def finish_game(self) -> dict[str, object]:
        """The flow's result: how the game ended (the full record is `flow.state`).

        A small dict, not the state itself: CrewAI serializes every method's result into its events.
        (Named unlike the label it listens to: a method is also a trigger of its own name, so a
        `game_over` method listening to `game_over` would call itself forever.)
        """
        return {"secret": self.state.secret, "guessed": self.state.guessed, "turns": self.state.turn}

    # ------------------------------------------------------------------ the two agents

    def player(self) -> Agent:
        """The player agent (a fresh one per turn: CrewAI agents keep per-run executor state)."""
        return Agent(
            role=PLAYER_ROLE,
            goal=PLAYER_GOAL,
            backstory=PLAYER_BACKSTORY,
            llm=self.player_llm,
            tools=[self.search_tool] if self.search_tool is not None else [],
            max_iter=self.player_max_iter,
            respect_context_window=False,  # summarizing the history would break the exact token prefix
            allow_delegation=False,
            verbose=False,
        )

    def answerer(self) -> Agent:
        """The answerer agent."""
        return Agent(
            role="Twenty Questions answerer",
            goal="Answer yes/no questions about the secret truthfully, without revealing it.",
            backstory="You know the secret and answer every question about it honestly and briefly.",
            llm=self.answerer_llm,
            max_iter=2,
            allow_delegation=False,
            verbose=False,
        )

    def _player_reply(self) -> str:
        """The player's raw reply text ("" when the call failed: a wasted turn)."""
        state = self.state
        tools_before = self.search_tool.calls if self.search_tool is not None else 0
        started = time.perf_counter()
        try:
            output = self.player().kickoff(list(state.messages))
        except Exception as error:  # a failed call (context too long, proxy error) costs the turn only
            state.player_errors += 1
            logger.warning("player call failed on turn %d: %s", state.turn, error)
            return ""
        finally:
            if self.search_tool is not None:
                state.tool_calls += self.search_tool.calls - tools_before
            logger.debug("turn %d: player %.2fs", state.turn, time.perf_counter() - started)
        # The last assistant message is the full sampled text (Thought/Final Answer included), which is
        # what must go back into the history for the next prompt to extend this one exactly.
        assistant = [m for m in output.messages if m.get("role") == "assistant"]
        return str(assistant[-1].get("content") or "") if assistant else str(output.raw or "")

    def _answer(self, question: str) -> AnswererResponse | None:
        """The answerer's structured answer, or None when there is no answerer or it failed."""
        state = self.state
        if self.answerer_llm is None:
            state.answerer_errors += 1
            return None
        agent = self.answerer()
        task = Task(
            description=ANSWERER_TASK.format(secret=state.secret, category=state.category, question=question),
            expected_output='JSON: {"brief_reason": "...", "yes_or_no": "yes" | "no" | "n/a", "correct": true | false}',
            output_pydantic=AnswererResponse,
            agent=agent,
        )
        started = time.perf_counter()
        try:
            result = answerer_crew(agent, task).kickoff()
            logger.debug("turn %d: answerer %.2fs", state.turn, time.perf_counter() - started)
            if isinstance(result.pydantic, AnswererResponse):
                return result.pydantic
            return AnswererResponse.model_validate(json.loads(result.raw))
        except Exception as error:  # a hosted answerer down or a malformed answer costs the turn only
            state.answerer_errors += 1
            logger.warning("answerer failed on turn %d: %s", state.turn, error)
            return None
