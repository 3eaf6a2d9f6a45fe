"""An instant OpenAI-compatible backend for the peer comparison in `bench/proxy.py`: every front end
(ours with `--sampler remote`, Agent-lightning 1.0's proxy, the rLLM gateway) forwards to it.

A bare ASGI app on uvicorn, no model and almost no work: `POST /v1/chat/completions` answers
"I'm here." with vLLM's extras (`prompt_token_ids`, `choices[0].token_ids`, logprobs);
`POST /v1/completions` speaks vLLM's token protocol (prompt ids echoed back, the answer's ids and
logprobs), which our remote sampler needs; `GET /v1/models` and `/health` answer too.

    python bench/_instant_backend.py --port 0    # prints READY <port>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
import uuid
from typing import Any

ANSWER_TEXT = "I'm here."
ANSWER_IDS = [43, 558, 578, 16, 2]  # the tiny tokenizer's ids of "I'm here." + <|im_end|>
PROMPT_IDS = [1, 634, 201, 74, 75, 2, 201, 1, 666, 201]


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "instant"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER_TEXT},
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": str(t), "logprob": -0.5, "top_logprobs": []} for t in ANSWER_IDS]},
                "token_ids": ANSWER_IDS,
            }
        ],
        "prompt_token_ids": PROMPT_IDS,
        "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": 5, "total_tokens": len(PROMPT_IDS) + 5},
    }


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    prompt = body.get("prompt") if isinstance(body.get("prompt"), list) else PROMPT_IDS
    limit = body.get("max_tokens") or len(ANSWER_IDS)
    ids = ANSWER_IDS[:limit]
    choices = [
        {
            "index": i,
            "text": ANSWER_TEXT,
            "token_ids": ids,
            "prompt_token_ids": prompt,
            "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [str(t) for t in ids]},
            "finish_reason": "stop" if len(ids) == len(ANSWER_IDS) else "length",
        }
        for i in range(int(body.get("n") or 1))
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model"),
        "choices": choices,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
    }


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The backend: answers at once, whatever the key."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    path = scope["path"]
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        body = {}
    if path.endswith("/chat/completions"):
        answer: Any = _chat(body)
    elif path.endswith("/completions"):
        answer = _completion(body)
    elif path.endswith("/models"):
        answer = {"object": "list", "data": [{"id": "instant", "object": "model", "owned_by": "bench"}]}
    else:
        answer = {"status": "ok"}
    data = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    """Serve on 127.0.0.1 (port 0: a free one) until killed."""
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    port = parser.parse_args().port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    config = uvicorn.Config(app, loop="asyncio", log_level="warning", access_log=False, timeout_keep_alive=75)
    server = uvicorn.Server(config)

    async def run() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        print(f"READY {sock.getsockname()[1]}", flush=True)
        await serving

    asyncio.run(run())


if __name__ == "__main__":
    main()
