"""Helpers for the remote-sampler tests: real `agl-bridge serve` subprocesses and a scriptable fake server.

`ServeSubprocess` starts `agl-bridge serve` on 127.0.0.1 with a free port (LiteLLM's proxy is one per
process, so a second server must be another process) and stops it. `FakeServer` is a small ASGI
app in a thread of the test process that speaks vLLM's `/v1/completions` shape and can misbehave
on demand (answer without token ids, be slow, answer 500) or relay to a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from shared_helpers import AGL_BRIDGE, free_port

from agl_bridge.testing.proxy_process import child_env

KEY = "sk-agl-remote-tests"
_SERVING = re.compile(r"serving '[^']+' \(.*\) at (?P<url>http://127\.0\.0\.1:\d+)/v1")


class ServeSubprocess:
    """`agl-bridge serve --port 0 --api-key KEY ...extra` in a subprocess; `url` once it serves.

    python/env: run it as `python -m agl_bridge.cli` of another venv, in a session of its own (the
    vLLM tests: `process.pid` is then the session id of everything it starts).
    """

    def __init__(
        self, model_dir: Path, store: Path, *extra: str, python: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.store = store
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        command = [AGL_BRIDGE] if python is None else [str(python), "-m", "agl_bridge.cli"]
        self.process = subprocess.Popen(
            [
                *command,
                "serve",
                "--model",
                str(model_dir),
                "--port",
                "0",
                "--store",
                str(store),
                "--api-key",
                KEY,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env() if env is None else env,
            cwd=store.parent,
            start_new_session=python is not None,
        )
        assert self.process.stderr is not None
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.process.stderr], daemon=True).start()
        self._url: str | None = None

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` of the server, waiting for it to start."""
        if self._url is None:
            deadline = time.monotonic() + 300
            while self._url is None and time.monotonic() < deadline:
                try:
                    line = self.lines.get(timeout=0.5)
                except queue.Empty:
                    if self.process.poll() is not None:
                        break
                    continue
                self.seen.append(line)
                if (match := _SERVING.search(line)) is not None:
                    self._url = match["url"]
            if self._url is None:
                raise AssertionError("agl-bridge serve did not start; stderr:\n" + "".join(self.seen))
        return self._url

    def stop(self) -> None:
        """Stop the server (Ctrl-C, then kill)."""
        if self.process.poll() is None:
            self.process.send_signal(2)  # Ctrl-C: uvicorn shuts down gracefully, the store is closed
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)


@contextlib.contextmanager
def serving(model_dir: Path, store: Path, *extra: str) -> Iterator[ServeSubprocess]:
    """A started `ServeSubprocess` (its `url` answers), stopped on exit."""
    server = ServeSubprocess(model_dir, store, *extra)
    try:
        server.url  # noqa: B018  (waits until it serves)
        yield server
    finally:
        server.stop()


def recorded_calls(store: Path, rollout: str) -> list:
    """The LLM calls a store holds for `rollout`."""
    from agl_bridge.store.export import open_existing_store

    async def read() -> list:
        async with open_existing_store(store) as opened:
            return [c async for c in opened.iter_llm_calls(rollout)]

    return asyncio.run(read())


def perturb_lora(client: Any, seed: int) -> None:
    """Give a TrainingClient's LoRA B matrices random values, so its adapter changes the model."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in client.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def trainer_logprobs(client: Any, tokens: list[int]) -> list[float]:
    """The trainer's raw logprob of each of `tokens` after the first."""
    import torch

    with torch.no_grad():
        logits = client.model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens[1:]).unsqueeze(1)).squeeze(1)
    return picked.tolist()


@dataclass
class FakeServer:
    """A vLLM-protocol server in a thread: `mode` is ok | no_ids | slow | error | relay.

    ok: answers every prompt with `reply` (its last prompt id, then 1, 2, ...) and logprob -0.25 each.
    no_ids: the same answer without token_ids / prompt_token_ids (an old vLLM). slow: sleeps
    `delay_s` first. error: HTTP 500. relay: forwards the body to `relay_to` with `relay_key`.
    `GET /v1/models` lists `model` with `max_model_len` as vLLM does (without it when None), in every
    mode. `requests` logs every other body it got, `headers` their headers.
    With `lora`, it keeps vLLM's LoRA registry: `/v1/load_lora_adapter` adds a name (400 if loaded),
    `/v1/unload_lora_adapter` removes one (404 if unknown), `/v1/models` lists each with `parent` =
    `model` and `root` = its path, and a request naming neither `model` nor a loaded adapter gets 404.
    """

    mode: str = "ok"
    delay_s: float = 2.0
    relay_to: str | None = None
    relay_key: str | None = None
    model: str = "m"
    max_model_len: int | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    lora: bool = False
    adapters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import uvicorn

        self.port = free_port()
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=self.port,
            log_level="error",
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    @property
    def url(self) -> str:
        """Base URL of the fake."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import json

        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body or b"{}")
        if scope["path"] != "/v1/models":  # the sampler asks it once per server: not a request the tests count
            self.requests.append({"path": scope["path"], **request})
            self.headers.append({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]})
        status, answer = await self._answer(scope["path"], request)
        payload = json.dumps(answer).encode()
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": payload})

    def _lora_answer(self, path: str, request: dict[str, Any]) -> tuple[int, Any] | None:
        """vLLM's LoRA routes and its 404 for an unknown model; None for a request it serves."""
        name = request.get("lora_name")
        if path == "/v1/load_lora_adapter":
            if name in self.adapters:
                return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}
            self.adapters[name] = request["lora_path"]
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if path == "/v1/unload_lora_adapter":
            if self.adapters.pop(name, None) is None:
                return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        model = request.get("model")
        if model != self.model and model not in self.adapters:
            return 404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}
        return None

    async def _answer(self, path: str, request: dict[str, Any]) -> tuple[int, Any]:
        if path == "/v1/models":
            entry: dict[str, Any] = {"id": self.model, "object": "model", "parent": None}
            if self.max_model_len is not None:
                entry["max_model_len"] = self.max_model_len
            listed = [
                {"id": name, "object": "model", "parent": self.model, "root": root}
                for name, root in self.adapters.items()
            ]
            return 200, {"object": "list", "data": [entry, *listed]}
        if self.lora:
            refused = self._lora_answer(path, request)
            if refused is not None:
                return refused
        if self.mode == "relay":
            async with httpx.AsyncClient(timeout=60) as client:
                response = await client.post(
                    f"{self.relay_to}{path}", json=request, headers={"Authorization": f"Bearer {self.relay_key}"}
                )
                try:
                    return response.status_code, response.json()
                except ValueError:
                    return response.status_code, response.text
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if self.mode == "error":
            return 500, {
                "error": {"message": "the engine crashed", "type": "server_error", "param": None, "code": None}
            }
        if path.endswith("lora_adapter"):
            return 200, "ok"
        prompt = request["prompt"]
        choices = []
        for index in range(request.get("n", 1)):
            tokens = [prompt[-1], 1, 2][: request.get("max_tokens") or 3]
            choice: dict[str, Any] = {
                "index": index,
                "text": "x",
                "finish_reason": "length",
                "logprobs": {"tokens": ["x"] * len(tokens), "token_logprobs": [-0.25] * len(tokens)},
            }
            if self.mode != "no_ids":
                choice.update(token_ids=tokens, prompt_token_ids=prompt)
            choices.append(choice)
        return 200, {"id": "cmpl-fake", "object": "text_completion", "model": request.get("model"), "choices": choices}
