"""W3C trace context carried from producer to handler in ``meta.traceparent``.

The producer side takes the ``traceparent`` of an enqueue from, in order:
the ``traceparent=`` argument, the current context (:func:`use_traceparent`,
or the job being handled when a handler enqueues), then the client's
``traceparent_provider`` (for example one reading OpenTelemetry's current
span). The worker reads ``meta.traceparent`` into ``ctx.traceparent`` and
makes it current while the handler runs, so jobs a handler enqueues carry it on.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from typing import Callable, Iterator, Optional

_TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

#: A callable giving the current ``traceparent`` (or ``None``).
TraceparentProvider = Callable[[], Optional[str]]

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("svc_client_traceparent", default=None)


def is_traceparent(value: str) -> bool:
    """Whether ``value`` is a well-formed W3C ``traceparent`` (version 00 layout)."""
    if not _TRACEPARENT_RE.match(value):
        return False
    _, trace_id, parent_id, _ = value.split("-")
    return trace_id != "0" * 32 and parent_id != "0" * 16 and not value.startswith("ff")


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current context, if one is set."""
    return _current.get()


@contextlib.contextmanager
def use_traceparent(traceparent: str | None) -> Iterator[None]:
    """Makes ``traceparent`` current for enqueues in this block (thread and task safe)."""
    if traceparent is not None and not is_traceparent(traceparent):
        raise ValueError(f"not a W3C traceparent: {traceparent!r}")
    token = _current.set(traceparent)
    try:
        yield
    finally:
        _current.reset(token)


def set_current(traceparent: str | None) -> contextvars.Token[str | None]:
    return _current.set(traceparent)


def reset_current(token: contextvars.Token[str | None]) -> None:
    _current.reset(token)


def new_traceparent(sampled: bool = True) -> str:
    """A fresh ``traceparent`` (random trace and span ids) for starting a trace."""
    trace_id = os.urandom(16).hex()
    span_id = os.urandom(8).hex()
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def child_traceparent(parent: str) -> str:
    """The same trace with a new span id (the parent's flags kept)."""
    if not is_traceparent(parent):
        raise ValueError(f"not a W3C traceparent: {parent!r}")
    version, trace_id, _, flags = parent.split("-")
    return f"{version}-{trace_id}-{os.urandom(8).hex()}-{flags}"


def resolve(explicit: str | None, provider: TraceparentProvider | None) -> str | None:
    """The ``traceparent`` an enqueue carries (see the module's description)."""
    if explicit is not None:
        if not is_traceparent(explicit):
            raise ValueError(f"not a W3C traceparent: {explicit!r}")
        return explicit
    value = _current.get()
    if value is None and provider is not None:
        value = provider()
    if value is not None and is_traceparent(value):
        return value
    return None
