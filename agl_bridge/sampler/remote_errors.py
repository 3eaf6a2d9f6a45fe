"""Errors of the remote sampler: each names the server and says what was wrong and what to do."""

from __future__ import annotations

from collections.abc import Sequence

from agl_bridge.sampler.base import ContextLengthError, SamplingParamError


class RemoteSamplerError(RuntimeError):
    """No server could serve a request; `failures` lists (server URL, what went wrong) per server tried."""

    def __init__(self, message: str, failures: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.failures = list(failures)

    @classmethod
    def from_failures(cls, what: str, failures: Sequence[tuple[str, str]]) -> RemoteSamplerError:
        """'<what> failed on every sampler server: URL: reason; URL: reason'."""
        detail = "; ".join(f"{url}: {reason}" for url, reason in failures)
        return cls(f"{what} failed on every sampler server ({len(failures)} tried): {detail}", failures)


class ServerFailure(Exception):
    """One server failed one request (down, slow, 5xx, or an answer without what we need).

    Internal: the sampler takes the server out of rotation, tries the next one, and reports all of
    them in a `RemoteSamplerError` if none works.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class RemoteRequestError(SamplingParamError):
    """A server refused the request itself (HTTP 4xx); another server would refuse it too."""

    def __init__(self, url: str, status: int, message: str, field: str | None) -> None:
        super().__init__(field or "request", f"sampler server {url} refused the request (HTTP {status}): {message}")
        self.url = url
        self.status = status


class RemoteContextLengthError(ContextLengthError):
    """A server said the prompt plus the tokens asked for do not fit its context window."""

    def __init__(self, url: str, prompt_length: int, max_context: int, message: str) -> None:
        super().__init__(prompt_length, max_context)
        self.args = (f"sampler server {url}: {message} (the prompt has {prompt_length} tokens)",)
        self.url = url
