"""CrewAI 1.6.1 with LiteLLM 1.106.2: the token counters that pile up in `litellm.input_callback`.

Every CrewAI agent makes its own `TokenCalcHandler` and passes it with each LLM call. LiteLLM's
`function_setup` appends each new one to `litellm.input_callback` (the one callback list it does not
cap) and walks that whole list on every later call. A game makes new agents every turn, so over a
40-step run the list grows by thousands and every call pays for all of them: an RL step's sampling
time rose from 18 to 33–48 s and an evaluation of 160 games from 42 to 95 s. A handler counts tokens in
its success hook only; its input hook is LiteLLM's no-op, so taking it off this one list loses nothing.
"""

from __future__ import annotations


def forget_crewai_token_counters() -> None:
    """Take CrewAI's token counters off `litellm.input_callback`, keeping every other callback."""
    import litellm
    from crewai.utilities.token_counter_callback import TokenCalcHandler

    litellm.input_callback[:] = [c for c in litellm.input_callback if not isinstance(c, TokenCalcHandler)]
