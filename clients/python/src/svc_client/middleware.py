"""Hooks around enqueue (producer side) and around execution (worker side).

Subclass :class:`Middleware` and override what you need; pass instances as
``middleware=[...]`` to :class:`~svc_client.Client`,
:class:`~svc_client.AsyncClient`, :class:`~svc_client.Worker` or the inline
client. The first middleware in the list is the outermost.

- :meth:`Middleware.before_enqueue` sees (and may change) every job body
  about to be sent: single enqueues, batch items, workflow jobs.
- :meth:`Middleware.enqueue` wraps each enqueue or batch of the sync client,
  :meth:`Middleware.enqueue_async` those of the async client; a single
  enqueue is a list of one.
- :meth:`Middleware.execute` wraps each handler run in a worker. It runs on
  the worker's event loop for sync handlers too: ``await call_next()`` runs
  the handler in its thread, which sees the context variables set here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

if TYPE_CHECKING:
    from .models import Job
    from .context import JobContext


class Middleware:
    """Pass-through hooks; override any of them."""

    def before_enqueue(self, body: dict[str, Any]) -> None:
        """Called with each job body before it is sent; change it in place."""

    def enqueue(
        self,
        bodies: list[dict[str, Any]],
        call_next: Callable[[list[dict[str, Any]]], list[Job]],
    ) -> list[Job]:
        """Around a sync enqueue (one body) or batch; returns the jobs."""
        return call_next(bodies)

    async def enqueue_async(
        self,
        bodies: list[dict[str, Any]],
        call_next: Callable[[list[dict[str, Any]]], Awaitable[list[Job]]],
    ) -> list[Job]:
        """Around an async enqueue (one body) or batch; returns the jobs."""
        return await call_next(bodies)

    async def execute(self, ctx: JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        """Around a handler run; returns the handler's result or raises its error."""
        return await call_next()


def chain_sync(
    middleware: Sequence[Middleware],
    last: Callable[[list[dict[str, Any]]], list[Job]],
) -> Callable[[list[dict[str, Any]]], list[Job]]:
    call = last
    for mw in reversed(middleware):
        call = _bind_sync(mw, call)
    return call


def _bind_sync(
    mw: Middleware, nxt: Callable[[list[dict[str, Any]]], list[Job]]
) -> Callable[[list[dict[str, Any]]], list[Job]]:
    return lambda bodies: mw.enqueue(bodies, nxt)


def chain_async(
    middleware: Sequence[Middleware],
    last: Callable[[list[dict[str, Any]]], Awaitable[list[Job]]],
) -> Callable[[list[dict[str, Any]]], Awaitable[list[Job]]]:
    call = last
    for mw in reversed(middleware):
        call = _bind_async(mw, call)
    return call


def _bind_async(
    mw: Middleware, nxt: Callable[[list[dict[str, Any]]], Awaitable[list[Job]]]
) -> Callable[[list[dict[str, Any]]], Awaitable[list[Job]]]:
    return lambda bodies: mw.enqueue_async(bodies, nxt)


def chain_execute(
    middleware: Sequence[Middleware],
    ctx: JobContext,
    last: Callable[[], Awaitable[Any]],
) -> Callable[[], Awaitable[Any]]:
    call = last
    for mw in reversed(middleware):
        call = _bind_execute(mw, ctx, call)
    return call


def _bind_execute(mw: Middleware, ctx: JobContext, nxt: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    return lambda: mw.execute(ctx, nxt)
