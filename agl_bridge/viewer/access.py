"""The viewer's door: a key on every page, and headers that keep the pages from reaching outside.

The key rule is `serve`'s (`agl_bridge.proxy.server.choose_api_key`): loopback by default with a
generated key, an explicit key required for any other bind. A browser brings the key once in the
URL the command prints (`/?key=...`); the gate answers with a cookie and a redirect to the same
page without the key, so the key leaves the address bar and the history. Scripts can send
`Authorization: Bearer KEY` instead.

Every response carries a Content-Security-Policy that allows only this server's own scripts,
styles and images: the pages cannot load anything from elsewhere, even by mistake.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

KEY_PARAM = "key"
STATIC_PREFIX = "/static/"

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}

_DENIED = """<!doctype html><html><head><meta charset="utf-8"><title>agl-bridge view: key needed</title></head>
<body><h1>This viewer needs its key</h1><p>Open the address <code>agl-bridge view</code> printed when it started
(it ends in <code>?key=…</code>), or send <code>Authorization: Bearer KEY</code>.</p></body></html>"""


def cookie_name(port: int) -> str:
    """Cookies are per host, not per port: two viewers on one machine keep separate keys."""
    return f"agl_view_{port}"


class KeyGate:
    """ASGI middleware: requests without the key get 401; a key in the URL becomes a cookie."""

    def __init__(self, app: ASGIApp, *, key: str, cookie: str) -> None:
        self.app = app
        self.key = key
        self.cookie = cookie

    def _matches(self, offered: str | None) -> bool:
        return offered is not None and secrets.compare_digest(offered.encode(), self.key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the key, then call the app with the security headers added to its response."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        request = Request(scope)
        response = self._gate(request)
        if response is not None:
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)

    def _gate(self, request: Request) -> Response | None:
        """None to let the request through, else the response to give instead."""
        if request.url.path.startswith(STATIC_PREFIX):
            return None
        offered = request.query_params.get(KEY_PARAM)
        if offered is not None:
            if not self._matches(offered):
                return HTMLResponse(_DENIED, status_code=401)
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != KEY_PARAM]
            target = URL(path=request.url.path, query=urlencode(rest))
            redirect = RedirectResponse(str(target), status_code=303)
            redirect.set_cookie(self.cookie, self.key, httponly=True, samesite="strict", path="/")
            return redirect
        bearer = request.headers.get("authorization", "")
        if self._matches(request.cookies.get(self.cookie)) or (
            bearer.lower().startswith("bearer ") and self._matches(bearer[7:].strip())
        ):
            return None
        return HTMLResponse(_DENIED, status_code=401)
