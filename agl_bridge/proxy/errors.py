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


def error_body(message: str, *, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None) -> dict[str, Any]:
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
