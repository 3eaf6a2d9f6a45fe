"""Serving the viewer: uvicorn on a socket bound first, so a taken port fails before anything is served."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import uvicorn

from agl_bridge.viewer.access import KEY_PARAM
from agl_bridge.viewer.app import Viewer, create_app


def viewer_url(host: str, port: int, key: str) -> str:
    """The address to open: it carries the key once (the page then keeps it in a cookie)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?{KEY_PARAM}={key}"


def serve_viewer(
    viewer: Viewer, sock: socket.socket, *, key: str, on_ready: Callable[[str], None] | None = None
) -> None:
    """Serve `viewer` on the listening `sock` until interrupted (Ctrl-C); closes the viewer at the end."""
    host, port = sock.getsockname()[:2]
    threading.Thread(target=viewer.settle, name="agl-view-settle", daemon=True).start()
    try:
        app = create_app(viewer, key=key, port=port)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        if on_ready is not None:
            on_ready(viewer_url(host, port, key))
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        viewer.close()
        sock.close()
