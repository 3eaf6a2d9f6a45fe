"""The one list of span names, span attribute keys, HTTP headers and environment variables.

Every module that writes or reads a span, a routing header or an `AGL_*` variable takes the name
from here, so that the proxy, the tracing processor, the OTLP receiver and the converter cannot
drift apart (a renamed key silently turning into "no spans found" is the failure this prevents).

LLM-call spans follow the OpenTelemetry GenAI semantic conventions for inference spans (span name
`{gen_ai.operation.name} {gen_ai.request.model}`, kind CLIENT, `gen_ai.*` attributes; checked
against the conventions of 2026, which are still in development upstream); reward spans also carry
the `gen_ai.evaluation.*` attributes of the convention's evaluation result. Everything the
conventions do not cover (token ids, logprobs, policy versions, rollout and attempt routing) lives
under our own `agl.` prefix. docs/telemetry.md lists every attribute we write.

Value encodings of our attributes (OTel attributes are flat scalars or homogeneous arrays):
  - token id lists and logprob lists are native OTel arrays (int / float sequences);
  - structured values (`agl.request.messages`, `agl.prefix_breaks`) are JSON strings;
  - `agl.call.kind` is `CALL_KIND_TOKEN` or `CALL_KIND_TEXT`.
"""

from __future__ import annotations

from typing import Final

# --- span names ---------------------------------------------------------------------------------

SPAN_REWARD: Final = "agl.reward"
"""One span per `emit_reward(...)`."""

SPAN_ROLLOUT: Final = "agl.rollout"
"""Optional parent span the runner opens around one attempt of one rollout."""


def llm_call_span_name(operation: str, model: str) -> str:
    """Name of the span of one LLM call: `{gen_ai.operation.name} {gen_ai.request.model}`, e.g. `chat tiny`."""
    return f"{operation} {model}"


# --- OpenTelemetry GenAI semantic-convention keys -----------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""The GenAI operation, e.g. `GEN_AI_OPERATION_CHAT`."""

GEN_AI_OPERATION_CHAT: Final = "chat"
"""Value of `gen_ai.operation.name` for chat completions."""

GEN_AI_OPERATION_TEXT_COMPLETION: Final = "text_completion"
"""Value of `gen_ai.operation.name` for token-prompt `/v1/completions` calls."""

GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
"""The provider (required by the convention; replaces the older `gen_ai.system`)."""

GEN_AI_PROVIDER_AGL_BRIDGE: Final = "agl_bridge"
"""`gen_ai.provider.name` of calls served by our token sampler (HF in-process, or vLLM behind it)."""

GEN_AI_PROVIDER_LITELLM: Final = "litellm"
"""`gen_ai.provider.name` of text-only calls the proxy routed through LiteLLM to another model."""

GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
"""The conversation a call belongs to: the rollout id (absent outside rollouts)."""

GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
"""The agent (or sub-agent) that made the call, when the request named it (`x-agent-name`)."""

GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
"""The model name the client asked for."""

GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
"""The model name that actually answered."""

GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
"""Array of finish reasons, one per choice (OpenAI vocabulary: stop, length, tool_calls, ...)."""

GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
"""Prompt tokens consumed."""

GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
"""Tokens produced."""

GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
"""The client's max_tokens."""

GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
"""The client's sampling temperature."""

GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
"""The client's nucleus sampling mass."""

GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
"""The client's sampling seed (only when it sent one)."""

GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
"""The client's top-k cut (only when one applies)."""

GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
"""String array: the client's stop strings (only when it sent some)."""

GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
"""The client's `n` (only when it is not 1)."""

GEN_AI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
"""On reward spans: the reward's name (the convention's evaluation metric name)."""

GEN_AI_EVALUATION_SCORE_VALUE: Final = "gen_ai.evaluation.score.value"
"""On reward spans: the reward value (float)."""

# --- agl_bridge keys ----------------------------------------------------------------------------

AGL_ROLLOUT_ID: Final = "agl.rollout_id"
"""The rollout a span belongs to (absent for calls made outside any rollout).

Also read as a *resource* attribute (e.g. from `OTEL_RESOURCE_ATTRIBUTES`) when a span carries
none: a process that runs exactly one rollout can be attributed once for all its spans.
"""

AGL_ATTEMPT_ID: Final = "agl.attempt_id"
"""The attempt of that rollout a span belongs to (span attribute, or resource attribute as above)."""

AGL_CHOICE_INDEX: Final = "agl.choice_index"
"""Which of the n choices of one request this span records (0 for n=1)."""

AGL_CALL_KIND: Final = "agl.call.kind"
"""`CALL_KIND_TOKEN` (exact token ids recorded) or `CALL_KIND_TEXT` (text only)."""

CALL_KIND_TOKEN: Final = "token"
"""A call served by our token sampler: token ids and logprobs are exact."""

CALL_KIND_TEXT: Final = "text"
"""A call to a model that gives no token ids: only text is recorded; not trainable."""

AGL_CALL_CLASS: Final = "agl.call.class"
"""The class the agent or harness declared for a call (`CALL_CLASSES`; header `x-agl-call-class`).

Absent when nothing was declared: the converter then infers the class from the attempt's recorded
token structure (agl_bridge/convert/graph.py)."""

AGL_CALL_PARENT: Final = "agl.call.parent"
"""The call a request declared as its parent (header `x-agl-parent-call`): the store sequence of a
call of the same attempt, as decimal text, or the raw value when the proxy could not resolve it."""

AGL_CALL_CARRIES: Final = "agl.call.carries"
"""Int array: store sequences of earlier calls of the attempt whose answer text this request sent back
inside a message of another role (a summary, a sub-agent's answer as a tool result); absent when none."""

CALL_CLASS_MAIN: Final = "main"
"""A turn of the chain that ends the attempt (the conversation the reward is about)."""

CALL_CLASS_RETRY: Final = "retry"
"""A discarded branch: its prompt was sent again and the conversation went on from a later sibling."""

CALL_CLASS_SIDE: Final = "side"
"""An auxiliary call whose conversation is never continued and never reaches the main chain (titles, probes)."""

CALL_CLASS_COMPACTION: Final = "compaction"
"""A call whose answer replaces the history: the main chain restarts after it from a prompt carrying it."""

CALL_CLASS_SUBAGENT: Final = "subagent"
"""A chain of its own started from the main chain, whose result returns into it."""

CALL_CLASSES: Final = (CALL_CLASS_MAIN, CALL_CLASS_RETRY, CALL_CLASS_SIDE, CALL_CLASS_COMPACTION, CALL_CLASS_SUBAGENT)
"""Every call class, in the order reports list them."""

AGL_PROMPT_TOKEN_IDS: Final = "agl.prompt_token_ids"
"""Int array: the prompt token ids exactly as the sampler consumed them."""

AGL_RESPONSE_TOKEN_IDS: Final = "agl.response_token_ids"
"""Int array: the sampled token ids."""

AGL_RESPONSE_LOGPROBS: Final = "agl.response_logprobs"
"""Float array: the sampler's logprob of each sampled token."""

AGL_POLICY_VERSION: Final = "agl.policy_version"
"""Int: the oldest policy version that produced any sampled token of this call."""

AGL_TOKEN_POLICY_VERSIONS: Final = "agl.token_policy_versions"
"""Int array: the policy version that produced each sampled token (weights can swap mid-call)."""

AGL_REQUEST_MESSAGES: Final = "agl.request.messages"
"""JSON string: the chat messages of the request."""

AGL_RESPONSE_TEXT: Final = "agl.response.text"
"""The decoded response text returned to the client."""

AGL_PREFIX_BREAKS: Final = "agl.prefix_breaks"
"""JSON string: where this prompt stopped extending the previous turn's tokens (see chat/)."""

AGL_REWARD_NAME: Final = "agl.reward.name"
"""Name of a reward (several named rewards may be emitted per rollout)."""

AGL_REWARD_VALUE: Final = "agl.reward.value"
"""Float: the reward value."""

# --- HTTP headers (rollout routing when the URL path cannot carry it) ----------------------------

HEADER_ROLLOUT_ID: Final = "x-rollout-id"
"""Request header naming the rollout a call belongs to."""

HEADER_ATTEMPT_ID: Final = "x-attempt-id"
"""Request header naming the attempt a call belongs to."""

HEADER_AGENT_NAME: Final = "x-agent-name"
"""Request header naming the agent that made a call (multi-agent rollouts choose which train)."""

HEADER_RECORDED_UPSTREAM: Final = "x-agl-recorded-upstream"
"""Request header a `RemoteSampler` sends on `/v1/completions`: whoever called the sampler (a proxy)
records the call, so an `agl-bridge serve` sampling for it does not store a second, unattributed copy."""

HEADER_CALL_CLASS: Final = "x-agl-call-class"
"""Request header declaring the call's class (one of `CALL_CLASSES`); wins over the converter's inference."""

HEADER_PARENT_CALL: Final = "x-agl-parent-call"
"""Request header declaring the call's parent: the `id` this proxy returned for an earlier call of the same
attempt (chat `chatcmpl-…`, Responses `resp_…`, Anthropic `msg_…`) or that call's store sequence."""

STATE_AGENT_SCOPE: Final = "agl.agent_scope"
"""Key of the ASGI request state where the front door puts the `AgentScope` of a request made with an agent
key (absent for the operator's), so routes behind it (the OTLP receiver, stored responses) keep to that scope."""

PATH_PARAM_ROLLOUT_ID: Final = "rollout_id"
"""Name of the rollout path parameter in `/rollout/{rollout_id}/attempt/{attempt_id}/v1/...` routes."""

PATH_PARAM_ATTEMPT_ID: Final = "attempt_id"
"""Name of the attempt path parameter in those routes."""

# --- the rollout lifecycle routes (under /rollout/{rollout_id}/attempt/{attempt_id}) ------------------

PATH_START: Final = "/start"
"""POST: start an attempt as running and name its task (`task_id`, `metadata`, `eval`)."""

PATH_REWARD: Final = "/reward"
"""POST: report a reward (`value`, `name`) for a running attempt."""

PATH_FINISH: Final = "/finish"
"""POST: finish an attempt with its outcome (`status`, `error`; the task may be named here too)."""

PATH_AGENT_KEY: Final = "/agent_key"
"""POST (operator key only): mint an agent key scoped to the attempt (`ttl_s` optional)."""

# --- OTLP/HTTP ------------------------------------------------------------------------------------

OTLP_TRACES_PATH: Final = "/v1/traces"
"""Path of the OTLP/HTTP trace receiver, relative to the proxy's base URL without `/v1`."""

TRACER_NAME: Final = "agl_bridge"
"""Instrumentation scope name of the spans agl_bridge itself creates (rewards)."""

# --- environment variables handed to agent processes --------------------------------------------

ENV_ROLLOUT_ID: Final = "AGL_ROLLOUT_ID"
"""The rollout an agent process is running."""

ENV_ATTEMPT_ID: Final = "AGL_ATTEMPT_ID"
"""The attempt an agent process is running."""

ENV_ENDPOINT: Final = "AGL_ENDPOINT"
"""Base URL of the proxy (OpenAI-compatible) the agent should call."""

ENV_TASK: Final = "AGL_TASK"
"""JSON of the task payload the agent should work on."""

ENV_API_KEY: Final = "AGL_API_KEY"
"""Key sent as `Authorization: Bearer ...` when exporting spans to the proxy (wins over the next)."""

ENV_OPENAI_API_KEY: Final = "OPENAI_API_KEY"
"""The OpenAI SDK's key variable; the agent already sends it to the proxy, so spans reuse it."""

ENV_SAMPLER_API_KEY: Final = "AGL_SAMPLER_API_KEY"
"""Key a remote sampler sends to its vLLM / agl-bridge servers (`--sampler-api-key` wins over it)."""

ENV_PROXY_API_KEY: Final = "AGL_PROXY_API_KEY"
"""Key of a training run's extra proxies (`proxy_urls`; the run config's `proxy_api_key` wins over it)."""

ENV_REWARD_TIMEOUT_S: Final = "AGL_REWARD_TIMEOUT_S"
"""Seconds `emit_reward` may spend delivering one reward (retries included); default 10."""
