"""A request whose client leaves before its answer is complete is cancelled, so it stops sampling.

Starlette stops only a streamed response when its client goes; a plain JSON answer keeps its
handler running to the end. For a sampler that is the expensive part: an agent whose HTTP client
times out (and retries) would leave its sample running as long as the context window allows, taking
batch slots and CPU from every other rollout. vLLM's server aborts such requests too. The sampler
frees a cancelled request's slots (`HFSampler.submit`, `VLLMSampler`); nothing is recorded for an
answer nobody received.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Send

DISCONNECT: Message = {"type": "http.disconnect"}


async def cancelled_on_disconnect(
    serve: Callable[[Receive, Send], Awaitable[None]], body: Message, receive: Receive, send: Send
) -> None:
    """Run `serve(receive, send)` on the request's whole `body` message, cancelled if the client leaves.

    Only the watcher reads the server's `receive` from here on; the app's `receive` answers `body`,
    then waits for the disconnect the watcher saw. A disconnect after the last body chunk was sent is
    the server's "response complete" signal, not a client leaving: the handler finishes (it may still
    record the call).
    """
    gone = asyncio.Event()
    answered = False
    pending = [body]

    async def app_receive() -> Message:
        if pending:
            return pending.pop()
        await gone.wait()
        return DISCONNECT

    async def app_send(message: Message) -> None:
        nonlocal answered
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True
        await send(message)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    serving = asyncio.ensure_future(serve(app_receive, app_send))
    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait((serving, watcher), return_when=asyncio.FIRST_COMPLETED)
        if gone.is_set() and not answered and not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            return
        await serving
    finally:
        for task in (watcher, serving):  # serving is still running only if we were cancelled (shutdown)
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
