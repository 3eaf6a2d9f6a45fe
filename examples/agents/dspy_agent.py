"""DSPy (`pip install dspy`) through agl-bridge: a `dspy.LM` on the proxy (LiteLLM's `openai/`
route) answering with a `Predict` module, the conversation passed as `dspy.History`.

DSPy renders each call's prompt afresh from its signature (earlier turns become fields of the new
prompt), so its calls never extend one another: each call is a training sequence of its own. Its
response cache is off (`cache=False`), or repeated rollouts would not reach the model at all.
Run it as an `AgentCommand`: `OPENAI_BASE_URL` (routed to the rollout attempt), `OPENAI_API_KEY`,
`AGL_MODEL`, and `AGL_TASK` whose `turns` are the user messages of one conversation.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list at import otherwise

import dspy

lm = dspy.LM(
    "openai/" + os.environ.get("AGL_MODEL", "tiny"),
    api_base=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
    cache=False,
)
dspy.configure(lm=lm)


class Chat(dspy.Signature):
    """Answer the question briefly."""

    question: str = dspy.InputField()
    history: dspy.History = dspy.InputField()
    answer: str = dspy.OutputField()


chat = dspy.Predict(Chat)
history = dspy.History(messages=[])
for turn in json.loads(os.environ.get("AGL_TASK", "{}")).get("turns", ["Say hello."]):
    answer = chat(question=turn, history=history).answer
    print(answer)
    history = dspy.History(messages=[*history.messages, {"question": turn, "answer": answer}])
