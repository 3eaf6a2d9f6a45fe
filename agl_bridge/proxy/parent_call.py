"""The parent a request declared for its call (header `x-agl-parent-call`), resolved to a store sequence.

An agent or harness names the call its request continues from (a sub-agent's first call names the
call that spawned it, a retry the call it retries) by the `id` this proxy answered that call with
— chat `chatcmpl-…`, Responses `resp_…`, Anthropic `msg_…`, all naming the call's rollout, attempt
and start time (`responses.key_of`) — or by that call's store sequence. The recorded parent is the
earlier call's sequence as decimal text when the id names a recorded call of the same rollout
attempt; anything else (an unknown id, a call of another attempt, a call outside rollouts, garbage)
is kept as sent, cut to `MAX_UNRESOLVED_CHARS`: the request is served all the same and the
converter reports the parent as unknown. Resolving never fails a request.
"""

from __future__ import annotations

import logging
import re

from agl_bridge.proxy.request import RolloutRoute
from agl_bridge.proxy.responses import CallKey, find_call, key_of
from agl_bridge.store.base import Store
from agl_bridge.store.errors import StoreError

logger = logging.getLogger(__name__)

MAX_UNRESOLVED_CHARS = 200
"""How much of a parent that names no call of the attempt is kept (enough to recognise it in a report)."""

_SEQUENCE = re.compile(r"[0-9]{1,18}")
_CHAT_ID_PREFIX = "chatcmpl-"
_MESSAGE_ID_PREFIX = "msg_"  # the bridge's Anthropic ids: "msg_" + the chat id without "chatcmpl-"


async def resolve_parent(store: Store, route: RolloutRoute) -> str | None:
    """The parent to record for a call served for `route`: a store sequence as decimal text when the
    declared parent names one, else the declared value (cut short); None when none was declared."""
    declared = route.parent_call
    if declared is None:
        return None
    if _SEQUENCE.fullmatch(declared):
        return str(int(declared))
    key = _call_key(declared)
    same_attempt = key is not None and (key.rollout_id, key.attempt_id) == (route.rollout_id, route.attempt_id)
    if key is not None and same_attempt and route.rollout_id is not None:
        try:
            call = await find_call(store, key)
        except StoreError as error:  # the call itself is still recorded, with the parent as sent
            logger.warning("could not look up the declared parent call %.100r: %s", declared, error)
            call = None
        if call is not None and call.sequence is not None:
            return str(call.sequence)
    return declared[:MAX_UNRESOLVED_CHARS]


def _call_key(declared: str) -> CallKey | None:
    """The call an id this proxy handed out names, or None for anything else."""
    if declared.startswith(_MESSAGE_ID_PREFIX):
        declared = _CHAT_ID_PREFIX + declared.removeprefix(_MESSAGE_ID_PREFIX)
    try:
        return key_of(declared)
    except Exception:  # LiteLLM's id decoder on a value that is none of ours: not a call of this proxy
        return None
