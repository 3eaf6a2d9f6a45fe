"""The access log: one line per request the proxy answers, so a user sees whether (and how) their agent reached it.

Each line: method, path (without the rollout prefix or any query), rollout and attempt, the scope of
the key (`key=operator`, `key=agent:ROLLOUT/ATTEMPT`, `key=refused`, `key=none`), status,
the prompt and completion tokens of the calls it recorded, and the latency to the end of the
response (a stream's last event included). Never the key, a header or any message content.
`agl-bridge serve` logs them to stderr unless `--no-log-requests`; in-process users enable the
`agl_bridge.access` logger at INFO (`log_requests`).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agl_bridge.proxy.request import REQUEST_TOKENS, RequestTokens

ACCESS_LOGGER = logging.getLogger("agl_bridge.access")
"""The logger the lines go to, at INFO."""


def log_requests(stream: TextIO = sys.stderr) -> None:
    """Write the access log to `stream` (once: a second call changes nothing)."""
    if not any(getattr(h, "agl_access", False) for h in ACCESS_LOGGER.handlers):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        handler.agl_access = True  # type: ignore[attr-defined]  # marks ours, so a second call adds none
        ACCESS_LOGGER.addHandler(handler)
    ACCESS_LOGGER.setLevel(logging.INFO)
    ACCESS_LOGGER.propagate = False


def access_line(
    method: str,
    path: str,
    rollout_id: str | None,
    attempt_id: str | None,
    status: int,
    tokens: RequestTokens,
    seconds: float,
    key_scope: str = "-",
) -> str:
    """One request's line (what the client chose — path, ids — escaped, so a line stays one line)."""
    return (
        f"{method} {_printable(path)} rollout={_printable(rollout_id or '-')} attempt={_printable(attempt_id or '-')} "
        f"key={_printable(key_scope)} status={status} "
        f"prompt_tokens={tokens.prompt} completion_tokens={tokens.completion} latency_ms={seconds * 1000:.1f}"
    )


async def logged(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    route: tuple[str, str | None, str | None],
    key_scope: str = "-",
) -> None:
    """Serve one HTTP request with `app` and log its line; `route` is (path, rollout, attempt) as the
    front door read them, `key_scope` who the key says sent it.

    The line is logged just before the answer's last chunk goes out, so a client that has its answer
    finds the line written; a request that ends without a complete answer (its client left) is logged
    when it ends.
    """
    started = time.perf_counter()
    tokens = RequestTokens()
    status = 0
    pending = True

    def log() -> None:
        nonlocal pending
        pending = False
        path, rollout_id, attempt_id = route
        seconds = time.perf_counter() - started
        line = access_line(scope["method"], path, rollout_id, attempt_id, status, tokens, seconds, key_scope)
        ACCESS_LOGGER.info(line)

    async def noting_send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body", False) and pending:
            log()
        await send(message)

    token = REQUEST_TOKENS.set(tokens)
    try:
        await app(scope, receive, noting_send)
    finally:
        REQUEST_TOKENS.reset(token)
        if pending:
            log()


def _printable(text: str) -> str:
    return text[:200].encode("unicode_escape").decode("ascii").replace(" ", "\\x20")
