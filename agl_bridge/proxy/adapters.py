"""vLLM's runtime LoRA routes on agl-bridge serve: `POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`.

The same weight-sync code drives vLLM and us. The bodies and answers are vLLM's: `{"lora_name",
"lora_path"}` → 200 with a plain-text success line; a name loaded twice → 400 "... has already been
loaded"; unloading an unknown name → 404 "... cannot be found".

One difference, by design: vLLM keeps every loaded adapter side by side, while the HF sampler holds
one merged set of weights. Loading an adapter here merges it in place of the previous one (between
decode steps, no request dropped); every loaded name — and the base name — then serves the newest
weights, and each token still reports the policy version that produced it. A name ending in `-v<N>`
sets policy version N (what `RemoteSampler` sends); any other name gets the current version + 1.
Unloading a name only stops it being accepted; the weights stay until the next load.

Only the operator key reaches these routes (the gateway answers an agent key 404). With an adapter
directory (`agl-bridge serve --adapter-dir`), `lora_path` must lie inside it — a path relative to
it, or an absolute one under it — with no `..` and no symlink leading out (the path is resolved
before it is read); anything else is a 403 naming `lora_path`.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from agl_bridge.proxy.completions import read_json_object
from agl_bridge.proxy.request import RequestError
from agl_bridge.sampler.adapter_files import AdapterFileError, read_peft_adapter
from agl_bridge.sampler.weights import embeddings_tied

_VERSIONED = re.compile(r"-v(?P<version>\d+)$")


class AdapterRegistry:
    """The adapter names this server accepts as `model`, and the policy version each was loaded as."""

    def __init__(self) -> None:
        self._loaded: dict[str, int] = {}
        self._lock = threading.Lock()

    def version_of(self, name: str) -> int | None:
        """The policy version `name` was loaded as, or None if it is not loaded."""
        with self._lock:
            return self._loaded.get(name)

    def names(self) -> list[str]:
        """Loaded adapter names, oldest first."""
        with self._lock:
            return list(self._loaded)

    def add(self, name: str, version: int) -> bool:
        """Register `name`; False if it was already loaded."""
        with self._lock:
            if name in self._loaded:
                return False
            self._loaded[name] = version
            return True

    def remove(self, name: str) -> bool:
        """Forget `name`; False if it was not loaded."""
        with self._lock:
            return self._loaded.pop(name, None) is not None


def confined(root: Path | None, given: str) -> str:
    """`given` as the path to read: inside `root` once resolved (symlinks followed), no `..`; unchanged without a
    root. A 403 `RequestError` naming `lora_path` otherwise."""
    if root is None:
        return given
    path = Path(given)
    base = root.resolve()
    if ".." in path.parts or not (path if path.is_absolute() else base / path).resolve().is_relative_to(base):
        raise RequestError(
            f"lora_path {given[:200]!r} is outside this server's adapter directory: save adapters under {root} "
            "(agl-bridge serve --adapter-dir) and name them by a path inside it, without '..' or symlinks leading out",
            "lora_path",
            code="forbidden",
            status=403,
        )
    return str((path if path.is_absolute() else base / path).resolve())


def make_adapter_router(sampler: Any, registry: AdapterRegistry, root: Path | None = None) -> APIRouter:
    """The two routes over `sampler` (which must have `load_lora`, like HFSampler); with `root`, adapters load
    only from inside that directory (`confined`)."""
    router = APIRouter()
    swap_lock = asyncio.Lock()

    async def load(request: Request) -> PlainTextResponse:
        body = await read_json_object(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        for field, value in (("lora_name", name), ("lora_path", path)):
            if not isinstance(value, str) or not value:
                raise RequestError(f"{field} is required: a non-empty string", field)
        assert isinstance(name, str) and isinstance(path, str)  # checked just above
        path = confined(root, path)
        if registry.version_of(name) is not None:
            raise RequestError(f"The lora adapter '{name}' has already been loaded.", "lora_name")
        if not hasattr(sampler, "load_lora"):
            raise RequestError(
                f"this server's sampler ({type(sampler).__name__}) cannot load LoRA adapters", "lora_name"
            )
        try:
            state, scaling, saved = await asyncio.to_thread(read_peft_adapter, path)
        except AdapterFileError as error:
            raise RequestError(str(error), "lora_path") from None
        if saved and embeddings_tied(getattr(sampler, "model", None)):
            raise RequestError(
                f"the adapter in {path} trains {saved} in full, but this server's model ties its output layer to the "
                "input embeddings; train without train_unembedding, or serve an untied copy of the model",
                "lora_path",
            )
        match = _VERSIONED.search(name)
        async with swap_lock:
            version = int(match["version"]) if match else int(sampler.policy_version) + 1
            try:
                await asyncio.to_thread(sampler.load_lora, state, scaling, version)
            except ValueError as error:  # shapes or names that do not fit this model
                raise RequestError(
                    f"the adapter in {path} does not fit this server's model: {error}", "lora_path"
                ) from None
            registry.add(name, version)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> PlainTextResponse:
        body = await read_json_object(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise RequestError("lora_name is required: a non-empty string", "lora_name")
        if not registry.remove(name):
            raise RequestError(f"The lora adapter '{name}' cannot be found.", "lora_name", code="not_found", status=404)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    router.add_api_route("/v1/load_lora_adapter", load, methods=["POST"])
    router.add_api_route("/v1/unload_lora_adapter", unload, methods=["POST"])
    return router
