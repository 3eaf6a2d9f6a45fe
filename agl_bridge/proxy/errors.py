"""OpenAI-style errors: what a bad request gets back, whichever layer refused it.

Every refusal has the body `{"error": {"message", "type", "param", "code"}}` and a 4xx status;
`param` names the offending field so users can fix the request without reading our code.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"


class RequestError(ValueError):
    """A request we refuse; becomes an OpenAI-style error with `status` (400 by default)."""

    def __init__(
        self, message: str, param: str | None = None, *, code: str | None = "invalid_value", status: int = 400
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


def error_body(
    message: str, *, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object for a JSON response."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def to_litellm_error(error: RequestError, model: str) -> Exception:
    """The LiteLLM exception that its proxy turns into this error's 400 body (param and code kept)."""
    import litellm

    converted = litellm.BadRequestError(message=error.message, model=model, llm_provider="agl")
    # The proxy copies these attributes into the error body; the constructor would prefix the message.
    converted.message = error.message
    converted.param = error.param
    converted.code = error.code
    converted.type = INVALID_REQUEST
    return converted


def store_unavailable_error(error: Exception, model: str) -> Exception:
    """The LiteLLM exception for a call that could not be recorded (store locked, disk full): a 503.

    The sample is not returned: an unrecorded call could never be trained on, and the client
    (or the runner's retry policy) should try again once the store is writable.
    """
    import litellm

    message = f"the call was not served because it could not be recorded: {error}"
    converted = litellm.ServiceUnavailableError(message=message, model=model, llm_provider="agl")
    converted.message = message
    converted.code = "store_unavailable"
    converted.type = "server_error"
    return converted


def sampler_unavailable_error(error: Exception, model: str) -> Exception:
    """The LiteLLM exception for a call no remote sampler server could serve: a 503 naming each server.

    Nothing is recorded for such a call; the agent's attempt fails with the message.
    """
    import litellm

    message = str(error)
    converted = litellm.ServiceUnavailableError(message=message, model=model, llm_provider="agl")
    converted.message = message
    converted.code = "sampler_unavailable"
    converted.type = "server_error"
    return converted
