"""The replica's own HTTP server: the ASGI app served from the replica's event loop, on the service's port.

Behind Ray Serve's HTTP proxy every streamed chunk crosses an actor call (replica → proxy) and the
proxy is one more process competing with the engine for the CPU. When a single replica answers all
HTTP (the CLI's local service with one engine replica, or the multi-model ingress), it can listen
itself and nothing sits between the socket and the engine. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket

import uvicorn
from starlette.types import ASGIApp

from app.config.service import ServiceConfig
from app.http.clocks import ConnectionLimits, GuardedHttpToolsProtocol

log = logging.getLogger(__name__)

# The kernel's send buffer per client connection. Autotuned, it grows to megabytes on loopback, and a client
# that stops reading is noticed (uvicorn's flow control pauses, the write-stall clock starts) only once it is
# full: at 3 KB/s of streamed tokens that took minutes. 64 KiB still carries tokens far faster than any model
# produces them.
SEND_BUFFER_BYTES = 64 * 1024
BACKLOG = 2048  # uvicorn's default; given to it too, which passes it to listen() again when it serves


class CannotListen(RuntimeError):
    pass


def bind_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening-ready TCP socket on (host, port); `CannotListen` saying what to do when taken.

    `reuse_port`: Serve starts the replacement of a dead replica while the old one may still hold the
    port; with SO_REUSEPORT on both, the new one can bind at once instead of failing its start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)  # accepted sockets inherit it
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno in (errno.EADDRINUSE, errno.EACCES):
            raise CannotListen(
                f"cannot listen on {host}:{port}: {err.strerror}; stop whatever holds the port "
                f"or set service.port to a free one"
            ) from err
        raise
    return sock


class HttpListener:
    """Lifecycle: `start()` (binds and serves in the running event loop) → `stop_accepting()` (when the
    replica is being stopped) → `stop()`."""

    def __init__(self, app: ASGIApp, host: str, port: int, service: ServiceConfig | None = None):
        self.host, self.port = host, port
        self._app = app
        self._service = service or ServiceConfig()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        sock = bind_socket(self.host, self.port, reuse_port=True)
        # Listening now, not when the loop first runs the server: a client that connects in between (a probe, a
        # test under load) waits in the backlog instead of being refused.
        sock.listen(BACKLOG)
        s = self._service
        limits = ConnectionLimits(
            max_connections=s.max_connections,
            max_connections_per_peer=s.max_connections_per_peer,
            header_timeout_s=s.header_timeout_s,
            body_timeout_s=s.body_timeout_s,
            write_stall_timeout_s=s.write_stall_timeout_s,
            max_header_bytes=s.max_header_bytes,
        )
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_keep_alive=max(1, round(s.keep_alive_timeout_s)),  # uvicorn takes whole seconds
            http=GuardedHttpToolsProtocol.protocol_class(limits),
            backlog=BACKLOG,
        )
        server = uvicorn.Server(config)
        # Signals belong to the Ray worker, never to a server inside it.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        self._task.add_done_callback(self._on_exit)
        log.info("serving HTTP on %s:%d from this replica", self.host, self.port)

    def _on_exit(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the replica's HTTP server stopped: %r", task.exception())

    def stop_accepting(self) -> None:
        """Close the listening socket now, synchronously; connections already open are left to `stop()`.

        A replica that Serve is stopping may share the port (SO_REUSEPORT) with its replacement: while
        its socket stays open the kernel keeps handing it new connections, which would die with it."""
        if self._server is None:
            return
        for server in self._server.servers:
            server.close()
        self._server.should_exit = True

    async def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            self._server.force_exit = True
            self._task.cancel()
        self._server = None
