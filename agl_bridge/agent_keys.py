"""Agent keys: credentials scoped to one rollout attempt, minted and checked without any state.

The operator key (`agl-bridge serve --api-key`) opens everything. An agent under training gets an
*agent key* instead: `agl-agent-` + base64url(JSON `[version, rollout_id, attempt_id, expires_at]`)
+ `.` + base64url(HMAC-SHA256 of that text under a key derived from the operator key). Any proxy
that holds the operator key accepts it — several proxies on one store need no shared table — and
no proxy needs to remember it. The proxy lets such a key reach the model routes of its own rollout
attempt only (`agl_bridge.proxy.gateway`).

Checks run in constant time over the signature, and a refusal never says which part of a token
was right: a tampered token and one minted under another operator key read the same.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

AGENT_KEY_PREFIX = "agl-agent-"
"""How every agent key starts (so logs, scanners and the gateway tell it from an operator key)."""

_VERSION = 1
_SIGNING_LABEL = b"agl-bridge agent keys v1"
_PREFIX_BYTES = AGENT_KEY_PREFIX.encode()


@dataclass(frozen=True)
class AgentScope:
    """What an agent key opens: the model routes of one rollout attempt, until `expires_at` (unix s; None: never)."""

    rollout_id: str
    attempt_id: str
    expires_at: float | None = None

    def describe(self) -> str:
        """The scope as the access log shows it (never the key itself)."""
        return f"agent:{self.rollout_id}/{self.attempt_id}"


@dataclass(frozen=True)
class KeyRefusal:
    """Why an agent key was refused, in words safe to send back (they name no part of the token as right)."""

    reason: str


def derived_key(operator_key: str | bytes, label: bytes) -> bytes:
    """A secret for one purpose (`label`), derived from the operator key so the key itself signs nothing."""
    raw = operator_key.encode() if isinstance(operator_key, str) else operator_key
    return hmac.new(raw, label, hashlib.sha256).digest()


class AgentKeys:
    """Mints and checks agent keys under one operator key."""

    def __init__(self, operator_key: str | bytes) -> None:
        if not operator_key:
            raise ValueError("agent keys need a non-empty operator key to sign them")
        self._signing = derived_key(operator_key, _SIGNING_LABEL)

    def mint(self, rollout_id: str, attempt_id: str, *, ttl_s: float | None = None) -> str:
        """An agent key for (rollout_id, attempt_id), valid for `ttl_s` s (None: until the operator key changes)."""
        if not rollout_id or not attempt_id:
            raise ValueError("an agent key needs both a rollout id and an attempt id")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be a positive number of seconds or None, got {ttl_s!r}")
        expires = None if ttl_s is None else int(time.time() + ttl_s) + 1
        payload = json.dumps([_VERSION, rollout_id, attempt_id, expires], separators=(",", ":")).encode()
        body = _PREFIX_BYTES + _b64(payload)
        return (body + b"." + _b64(self._sign(body))).decode()

    def check(self, token: bytes | str, *, now: float | None = None) -> AgentScope | KeyRefusal:
        """The scope `token` opens, or why it opens nothing."""
        raw = token.encode() if isinstance(token, str) else token
        body, dot, signature = raw.rpartition(b".")
        # Compared as text, in constant time: one spelling per key (base64's padding bits could otherwise
        # be varied), and a malformed signature still costs one HMAC, so timing says nothing about how far
        # a forged token got.
        expected = _b64(self._sign(body))
        if not dot or not hmac.compare_digest(expected, signature) or not body.startswith(_PREFIX_BYTES):
            return KeyRefusal("the agent key is not valid for this server (altered, truncated, or minted elsewhere)")
        try:
            version, rollout_id, attempt_id, expires = json.loads(_unb64(body[len(_PREFIX_BYTES) :]) or b"")
        except (ValueError, TypeError):
            return KeyRefusal("the agent key is not valid for this server (altered, truncated, or minted elsewhere)")
        if version != _VERSION or not isinstance(rollout_id, str) or not isinstance(attempt_id, str):
            return KeyRefusal("the agent key has a format this server does not read; mint a new one")
        if expires is not None and (time.time() if now is None else now) >= expires:
            return KeyRefusal("the agent key has expired; the harness mints a new one for each attempt")
        return AgentScope(rollout_id, attempt_id, None if expires is None else float(expires))

    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self._signing, body, hashlib.sha256).digest()


def is_agent_key(token: bytes | str) -> bool:
    """Whether `token` looks like an agent key (checked or not)."""
    raw = token.encode() if isinstance(token, str) else token
    return raw.startswith(_PREFIX_BYTES)


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(text: bytes) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    except ValueError:
        return None
