"""The Tinker API's HTTP routes (`/api/v1/...`), as the `tinker` SDK 0.38 calls them.

Each route parses its request, hands the work to `TinkerService` and answers in the shape the SDK
validates: an immediate JSON record, or a future (`{"request_id"}`) whose outcome `retrieve_future`
returns — JSON, protobuf (forward/backward and sample results, which the SDK refuses as JSON) or
`{"error", "category"}`. A request we cannot read gets a 400 with a JSON body that names the field
(the SDK retries an empty 400, so the body is never empty) and the server stays up.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agl_bridge.sampler.base import SamplingParams
from agl_bridge.tinker_api.checkpoints import delete_checkpoint, list_checkpoints
from agl_bridge.tinker_api.service import TinkerService, UserError, sequence_ids
from agl_bridge.tinker_api.wire import decode_forward_backward

PROTOBUF = "application/x-protobuf"

# What the SDK asks first. Its faster transport (pyqwest), compressed forward/backward bodies and the
# batched future poller are switched off: the plain httpx path is the one this server is tested with.
CLIENT_CONFIG = {
    "use_pyqwest_transport": False,
    "pjwt_auth_enabled": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}

Handler = Callable[[Request], Awaitable[Response]]


def create_app(service: TinkerService, api_key: str) -> Starlette:
    """The ASGI app serving `service` to clients that present `api_key` (header X-API-Key)."""

    def guarded(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            presented = request.headers.get("x-api-key", "")
            if not hmac.compare_digest(presented.encode(), api_key.encode()):
                return JSONResponse({"detail": "missing or wrong X-API-Key; use the key the server printed"}, 401)
            try:
                return await handler(request)
            except ValueError as error:  # our refusals (UserError, WireError, CheckpointPathError, ...) are ValueErrors
                return JSONResponse({"detail": str(error)}, 400)

        return endpoint

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.body() or b"{}")
        except ValueError as error:
            raise UserError(f"the body is not JSON: {error}") from None
        if not isinstance(data, dict):
            raise UserError("the body must be a JSON object")
        return data

    def field(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
        value = data.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise UserError(f"{name}: expected {expected}, got {value!r}")
        return value

    def future(request_id: str, **extra: Any) -> JSONResponse:
        return JSONResponse({"request_id": request_id, **extra})

    async def client_config(request: Request) -> Response:
        return JSONResponse(CLIENT_CONFIG)

    async def dynamic_config(request: Request) -> Response:
        return JSONResponse({})

    async def create_session(request: Request) -> Response:
        return JSONResponse({"session_id": service.create_session()})

    async def heartbeat(request: Request) -> Response:
        return JSONResponse({})

    async def telemetry(request: Request) -> Response:
        return JSONResponse({"status": "accepted"})

    async def finish_session(request: Request) -> Response:
        service.session(request.path_params["session_id"])
        return JSONResponse({})

    async def create_model(request: Request) -> Response:
        data = await body(request)
        lora = data.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise UserError("lora_config: expected an object")
        rank = lora.get("rank", 32)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise UserError(f"lora_config.rank: expected an integer >= 1, got {rank!r}")
        request_id = service.create_model(
            field(data, "session_id", str), field(data, "model_seq_id", int), field(data, "base_model", str), lora
        )
        return future(request_id)

    async def get_info(request: Request) -> Response:
        return JSONResponse(service.info(field(await body(request), "model_id", str)))

    async def forward_backward(request: Request) -> Response:
        if request.headers.get("content-encoding", "identity") != "identity":
            raise UserError("compressed forward_backward bodies are not accepted (proto_compress_fwdbwd is off)")
        call = decode_forward_backward(await request.body())
        return future(service.forward_backward(call), model_id=call.model_id)

    async def optim_step(request: Request) -> Response:
        data = await body(request)
        adam = data.get("adam_params")
        if not isinstance(adam, dict):
            raise UserError("adam_params: expected an object (this server implements AdamW only)")
        model_id = field(data, "model_id", str)
        return future(service.optim_step(model_id, field(data, "seq_id", int), adam), model_id=model_id)

    async def save_weights(request: Request) -> Response:
        data = await body(request)
        model_id = field(data, "model_id", str)
        return future(service.save_state(model_id, field(data, "seq_id", int), field(data, "path", str)))

    async def save_weights_for_sampler(request: Request) -> Response:
        data = await body(request)
        model_id = field(data, "model_id", str)
        name = data.get("path")
        sampling_seq_id = data.get("sampling_session_seq_id")
        if name is None and not isinstance(sampling_seq_id, int):
            raise UserError("save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id")
        request_id = service.save_for_sampler(
            model_id,
            field(data, "seq_id", int),
            name=field(data, "path", str) if name is not None else None,
            sampling_seq_id=sampling_seq_id,
            follow=data.get("kind") == "inflight",
        )
        return future(request_id)

    async def load_weights(request: Request) -> Response:
        data = await body(request)
        path = field(data, "path", str)
        optimizer = bool(data.get("optimizer", False))
        if data.get("model_id") is None:  # "create via load": a new training client from the checkpoint
            request_id = service.load_into_new_model(
                field(data, "session_id", str),
                field(data, "model_seq_id", int),
                path,
                optimizer=optimizer,
                base_model=data.get("base_model"),
            )
        else:
            model_id = field(data, "model_id", str)
            request_id = service.load_state(model_id, field(data, "seq_id", int), path, optimizer=optimizer)
        return future(request_id)

    async def create_sampling_session(request: Request) -> Response:
        data = await body(request)
        sampler_id = await service.create_sampling_session(
            field(data, "session_id", str),
            field(data, "sampling_session_seq_id", int),
            base_model=data.get("base_model"),
            model_path=data.get("model_path"),
        )
        return JSONResponse({"sampling_session_id": sampler_id})

    async def get_sampler(request: Request) -> Response:
        session = service.sampling_session(request.path_params["sampler_id"])
        return JSONResponse(
            {"sampler_id": session.session_id, "base_model": session.base_name, "model_path": session.model_path}
        )

    async def asample(request: Request) -> Response:
        data = await body(request)
        for option in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if data.get(option):
                raise UserError(f"{option}: top-k logprobs are not served yet; leave it at 0")
        if data.get("target_prompt_logprobs") is not None or data.get("prompt_logprobs_last_n") is not None:
            raise UserError("target_prompt_logprobs / prompt_logprobs_last_n are not served yet")
        num_samples = field(data, "num_samples", int)
        request_id = service.sample(
            field(data, "sampling_session_id", str),
            _prompt_tokens(data.get("prompt")),
            _sampling_params(data.get("sampling_params") or {}),
            num_samples,
            bool(data.get("prompt_logprobs", False)),
            record=bool(data.get("record_stability_info", False)),
        )
        return future(request_id, sample_sequence_ids=sequence_ids(request_id, num_samples))

    async def retrieve_future(request: Request) -> Response:
        request_id = field(await body(request), "request_id", str)
        if not service.futures.known(request_id):
            return JSONResponse({"detail": f"unknown request_id {request_id!r} (expired or never made)"}, 404)
        outcome = await service.futures.wait(request_id)
        if outcome is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if outcome.error is not None:
            return JSONResponse({"error": outcome.error, "category": outcome.category})
        if outcome.proto is not None:
            return Response(outcome.proto, media_type=PROTOBUF)
        return JSONResponse(outcome.json)

    async def capabilities(request: Request) -> Response:
        names = list(service.models.names) or ["tiny"]
        return JSONResponse(
            {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True} for name in names]}
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def training_run(request: Request) -> Response:
        return JSONResponse(_training_run(service, request.path_params["model_id"]))

    async def training_runs(request: Request) -> Response:
        runs = [_training_run(service, model_id) for model_id in service.runs]
        return JSONResponse(
            {"training_runs": runs, "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}
        )

    async def checkpoints(request: Request) -> Response:
        model_id = request.path_params["model_id"]
        service.run(model_id)
        return JSONResponse({"checkpoints": list_checkpoints(service.root, model_id)})

    async def remove_checkpoint(request: Request) -> Response:
        delete_checkpoint(service.root, request.path_params["model_id"], request.path_params["checkpoint_id"])
        return JSONResponse({})

    routes = [
        ("POST", "/client/config", client_config),
        ("POST", "/client/dynamic_config", dynamic_config),
        ("POST", "/create_session", create_session),
        ("POST", "/session_heartbeat", heartbeat),
        ("POST", "/telemetry", telemetry),
        ("POST", "/sessions/{session_id}/finish", finish_session),
        ("POST", "/create_model", create_model),
        ("POST", "/get_info", get_info),
        ("POST", "/forward_backward", forward_backward),
        ("POST", "/optim_step", optim_step),
        ("POST", "/save_weights", save_weights),
        ("POST", "/save_weights_for_sampler", save_weights_for_sampler),
        ("POST", "/load_weights", load_weights),
        ("POST", "/create_sampling_session", create_sampling_session),
        ("GET", "/samplers/{sampler_id}", get_sampler),
        ("POST", "/asample", asample),
        ("POST", "/retrieve_future", retrieve_future),
        ("GET", "/get_server_capabilities", capabilities),
        ("GET", "/healthz", health),
        ("GET", "/training_runs", training_runs),
        ("GET", "/training_runs/{model_id}", training_run),
        ("GET", "/training_runs/{model_id}/checkpoints", checkpoints),
        ("DELETE", "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}", remove_checkpoint),
    ]
    return Starlette(
        routes=[Route(f"/api/v1{path}", guarded(handler), methods=[method]) for method, path, handler in routes]
    )


def _prompt_tokens(prompt: Any) -> list[int]:
    chunks = prompt.get("chunks") if isinstance(prompt, dict) else None
    if not isinstance(chunks, list):
        raise UserError("prompt.chunks: expected a list of chunks")
    tokens: list[int] = []
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type") != "encoded_text":
            kind = chunk.get("type") if isinstance(chunk, dict) else type(chunk).__name__
            raise UserError(f"prompt.chunks[{index}]: a {kind} chunk; this server samples from text tokens only")
        values = chunk.get("tokens")
        if not isinstance(values, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in values):
            raise UserError(f"prompt.chunks[{index}].tokens: expected a list of token ids")
        tokens.extend(values)
    return tokens


def _sampling_params(data: Any) -> SamplingParams:
    if not isinstance(data, dict):
        raise UserError("sampling_params: expected an object")
    top_k = data.get("top_k", -1)
    return SamplingParams(
        max_tokens=data.get("max_tokens"),
        temperature=data.get("temperature", 1.0),
        top_p=data.get("top_p", 1.0),
        top_k=-1 if top_k == 0 else top_k,
        stop=data.get("stop"),
        seed=data.get("seed"),
    )


def _training_run(service: TinkerService, model_id: str) -> dict[str, Any]:
    run = service.run(model_id)
    found = list_checkpoints(service.root, model_id)
    latest = {
        kind: next((c for c in reversed(found) if c["checkpoint_type"] == kind), None)
        for kind in ("training", "sampler")
    }
    return {
        "training_run_id": model_id,
        "base_model": run.base_name,
        "model_owner": "local",
        "is_lora": True,
        "corrupted": False,
        "lora_rank": run.lora["rank"],
        "last_request_time": run.last_request.isoformat(),
        "last_checkpoint": latest["training"],
        "last_sampler_checkpoint": latest["sampler"],
        "user_metadata": {},
    }
