"""The proxy's pre-bound listening socket: accepted connections must not wait on Nagle's algorithm.

asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP; a listening socket created
with protocol 0 made every response body wait ~40 ms for the client's delayed ACK.
"""

from __future__ import annotations

import asyncio
import socket

from agl_bridge.proxy.server import bind_socket


async def test_accepted_connections_have_tcp_nodelay() -> None:
    listener = bind_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    accepted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=listener)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(accepted, 5)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
