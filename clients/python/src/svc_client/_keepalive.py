"""A lean HTTP/1.1 keep-alive transport for httpx on asyncio (plain ``http://``).

The worker sends small requests (acks that fetch the next jobs, fetches,
heartbeats) to one server over loopback or a LAN, where the
general-purpose connection pool under ``httpx.AsyncClient`` costs several
times what the request itself does.
This transport keeps a stack of open connections per server and speaks
just enough HTTP/1.1 for svc: ``Content-Length`` and chunked bodies,
keep-alive, ``Connection: close``. It plugs in under an ordinary
``httpx.AsyncClient`` and raises httpx's exceptions, so everything above it
(errors, retries, timeouts) is unchanged.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import httpx

_MAX_HEAD = 64 * 1024

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - Python 3.10
    import contextlib

    @contextlib.asynccontextmanager
    async def _timeout(delay: float | None) -> Any:
        if delay is None:
            yield
            return
        task = asyncio.current_task()
        assert task is not None
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        handle = asyncio.get_running_loop().call_later(delay, fire)
        try:
            yield
        except asyncio.CancelledError:
            if fired:
                raise TimeoutError() from None
            raise
        finally:
            handle.cancel()


class _Conn:
    __slots__ = ("reader", "writer", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # closing a broken socket
            pass


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over asyncio streams, at most ``max_connections`` per server."""

    def __init__(self, max_connections: int = 16) -> None:
        self._max = max(1, max_connections)
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._freed: asyncio.Condition | None = None
        self._closed = False

    def _condition(self) -> asyncio.Condition:
        if self._freed is None:
            self._freed = asyncio.Condition()
        return self._freed

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol("this transport speaks plain http only", request=request)
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.host, request.url.port or 80)
        conn = await self._acquire(key, timeouts.get("pool"), timeouts.get("connect"), request)
        keep = False
        try:
            response, keep = await self._exchange(conn, request, timeouts.get("read"))
            return response
        finally:
            await self._release(key, conn, keep)

    async def _acquire(
        self, key: tuple[str, int], pool_timeout: float | None, connect_timeout: float | None, request: httpx.Request
    ) -> _Conn:
        if self._closed:
            raise httpx.ConnectError("the transport is closed", request=request)
        cond = self._condition()
        async with cond:
            idle = self._idle.setdefault(key, [])
            while True:
                while idle:
                    conn = idle.pop()
                    if conn.usable():
                        return conn
                    conn.close()
                    self._open[key] -= 1
                if self._open.get(key, 0) < self._max:
                    self._open[key] = self._open.get(key, 0) + 1
                    break
                try:
                    async with _timeout(pool_timeout):
                        await cond.wait()
                except TimeoutError:
                    raise httpx.PoolTimeout("no connection free in time", request=request) from None
        try:
            async with _timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(key[0], key[1], limit=_MAX_HEAD * 4)
        except TimeoutError:
            await self._forget(key)
            raise httpx.ConnectTimeout("connecting timed out", request=request) from None
        except OSError as exc:
            await self._forget(key)
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        except BaseException:
            await self._forget(key)
            raise
        return _Conn(reader, writer)

    async def _forget(self, key: tuple[str, int]) -> None:
        cond = self._condition()
        async with cond:
            self._open[key] -= 1
            cond.notify()

    async def _release(self, key: tuple[str, int], conn: _Conn, keep: bool) -> None:
        cond = self._condition()
        if keep and not self._closed and conn.usable():
            conn.reused = True
            self._idle.setdefault(key, []).append(conn)
            # A waiter may take it; notify under the lock.
            async with cond:
                cond.notify()
            return
        conn.close()
        async with cond:
            self._open[key] -= 1
            cond.notify()

    async def _exchange(
        self, conn: _Conn, request: httpx.Request, read_timeout: float | None
    ) -> tuple[httpx.Response, bool]:
        body = await request.aread()
        target = request.url.raw_path or b"/"
        lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        has_length = False
        for name, value in request.headers.raw:
            lower = name.lower()
            if lower in (b"accept-encoding", b"transfer-encoding", b"connection"):
                continue
            if lower == b"content-length":
                has_length = True
            lines.append(name + b": " + value)
        if body and not has_length:
            lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
        elif not body and request.method in ("POST", "PUT", "PATCH") and not has_length:
            lines.append(b"Content-Length: 0")
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        try:
            conn.writer.write(head + body if body else head)
            await conn.writer.drain()
        except (OSError, RuntimeError) as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        try:
            async with _timeout(read_timeout):
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                status_line, _, raw_head = raw.partition(b"\r\n")
                status, headers, keep = _parse_head(status_line, raw_head, request)
                content = await _read_body(conn.reader, headers, request.method, status)
                if content is None:
                    keep = False
                    content = await conn.reader.read()
        except TimeoutError:
            raise httpx.ReadTimeout("no answer in time", request=request) from None
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise httpx.RemoteProtocolError(
                    "server disconnected without sending a response", request=request
                ) from exc
            raise httpx.ReadError("connection closed mid-response", request=request) from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError("response head too large", request=request) from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
        response = httpx.Response(
            status,
            headers=headers,
            content=content,
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )
        return response, keep

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _parse_head(
    status_line: bytes, raw_head: bytes, request: httpx.Request
) -> tuple[int, list[tuple[bytes, bytes]], bool]:
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}", request=request)
    status = int(parts[1])
    keep = parts[0] == b"HTTP/1.1"
    headers: list[tuple[bytes, bytes]] = []
    for line in raw_head.split(b"\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx.RemoteProtocolError("malformed header line", request=request)
        name, value = name.strip(), value.strip()
        if name.lower() == b"connection":
            tokens = {t.strip().lower() for t in value.split(b",")}
            if b"close" in tokens:
                keep = False
            elif b"keep-alive" in tokens:
                keep = True
        headers.append((name, value))
    return status, headers, keep


async def _read_body(
    reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]], method: str, status: int
) -> bytes | None:
    """The body; ``None`` when it runs to the end of the connection."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b""
    length: int | None = None
    chunked = False
    for name, value in headers:
        lower = name.lower()
        if lower == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif lower == b"content-length":
            length = int(value)
    if chunked:
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    if length is not None:
        return await reader.readexactly(length) if length else b""
    return None
