"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any, Callable, Iterator

import httpx

from svc_client import Worker


@contextlib.contextmanager
def running(worker: Worker, join_timeout: float = 40.0) -> Iterator[threading.Thread]:
    """Runs ``worker`` in a thread for the block, then stops it and waits for it."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test
            errors.append(exc)

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    wait_until(lambda: worker._loop is not None or not thread.is_alive(), timeout=5)
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(join_timeout)
        assert not thread.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class LoseResponses(httpx.BaseTransport):
    """Sends requests to the server but drops the answers of the first ``n``
    matching ones and raises a reset instead: the request was applied, the
    client cannot know."""

    def __init__(self, method: str, path_suffix: str, n: int = 1) -> None:
        self.inner = httpx.HTTPTransport()
        self.method = method
        self.path_suffix = path_suffix
        self.remaining = n
        self.requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == self.method and request.url.path.endswith(self.path_suffix):
            self.requests += 1
            if self.remaining > 0:
                self.remaining -= 1
                response.read()
                response.close()
                raise httpx.ReadError("connection reset by peer (simulated)", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncLoseResponses(httpx.AsyncBaseTransport):
    """:class:`LoseResponses` for the async client (the worker's)."""

    def __init__(self, method: str, path_suffix: str, n: int = 1) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.method = method
        self.path_suffix = path_suffix
        self.remaining = n
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == self.method and request.url.path.endswith(self.path_suffix):
            self.requests += 1
            if self.remaining > 0:
                self.remaining -= 1
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset by peer (simulated)", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class AsyncRecorder(httpx.AsyncBaseTransport):
    """Passes requests through and keeps (time, method, path, body) of each."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[tuple[float, str, str, bytes]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.seen.append((time.monotonic(), request.method, request.url.path, body))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def paths(self, since: float = 0.0) -> list[str]:
        return [path for at, _, path, _ in self.seen if at >= since]


class AsyncScripted(httpx.AsyncBaseTransport):
    """Passes requests through and keeps (method, path, JSON body) of each.

    The POSTs whose path ends in ``path_suffix`` take, one after the other,
    the actions in ``script`` (then ``"pass"``): ``"drop"`` fails before the
    server sees the request (a reset: the client cannot tell), ``"lose"``
    lets the server apply it and then drops the answer, and a number holds
    the answer back that many seconds.
    """

    def __init__(self, path_suffix: str, script: list[str | float]) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.path_suffix = path_suffix
        self.script = list(script)
        self.seen: list[tuple[str, str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.seen.append((request.method, request.url.path, json.loads(body) if body else None))
        action: str | float = "pass"
        if request.method == "POST" and request.url.path.endswith(self.path_suffix) and self.script:
            action = self.script.pop(0)
        if action == "drop":
            raise httpx.ReadError("connection reset by peer (simulated)", request=request)
        response = await self.inner.handle_async_request(request)
        if action == "lose":
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("connection reset by peer (simulated)", request=request)
        if isinstance(action, (int, float)):
            await response.aread()
            await asyncio.sleep(action)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    def bodies(self, path_suffix: str) -> list[Any]:
        return [body for method, path, body in self.seen if method == "POST" and path.endswith(path_suffix)]
