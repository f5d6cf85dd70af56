"""Requests as data, and the rule that decides which failures are retried.

Every operation is described by a :class:`Call` (method, path, body, how to
read the answer, how safe it is to send again). :class:`svc_client.Client`
and :class:`svc_client.AsyncClient` send the same calls; only the I/O differs.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, TypeVar

import httpx

from ._wire import dumps
from .errors import (
    OverloadedError,
    QueuePausedError,
    RateLimitedError,
    ServerTimeoutError,
    SvcError,
    TransportError,
    UnavailableError,
    error_from_response,
)
from .version import __version__

T = TypeVar("T")

MEDIA_TYPE = "application/svc+json"
API_PREFIX = "/svc/v1"
USER_AGENT = f"svc-client-python/{__version__}"


class Safety(enum.Enum):
    """How safe a request is to send again after a failure."""

    #: Sending it twice does what sending it once does (reads, cancel,
    #: heartbeats, pause/resume, cron upserts, an enqueue with a client id).
    IDEMPOTENT = "idempotent"
    #: It may create something twice: sent again only when the failure
    #: proves the first try was not applied.
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class RetryConfig:
    """How transient failures are retried.

    A try that failed transiently waits ``min(max_backoff, backoff * 2**n)``
    seconds times a random factor in [0.5, 1.0] (or the server's
    ``Retry-After``, when longer) and is sent again, up to ``attempts`` tries
    in all and no later than ``max_elapsed`` seconds after the first.
    ``attempts=1`` turns retries off.
    """

    attempts: int = 6
    backoff: float = 0.1
    max_backoff: float = 5.0
    max_elapsed: float = 30.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        base = min(self.max_backoff, self.backoff * (2.0 ** max(retry - 1, 0)))
        delay = base * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay



@dataclass
class Recovery(Generic[T]):
    """Calls to make instead of failing, and how to combine their answers."""

    calls: list[Call[Any]]
    combine: Callable[[list[Any]], T]


@dataclass
class Call(Generic[T]):
    """One API operation."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    has_body: bool = False
    params: Mapping[str, Any] | None = None
    safety: Safety = Safety.IDEMPOTENT
    #: After a try whose fate is unknown (a reset, a 504), the error a later
    #: try gets may mean the first one landed (an id in use, a job no longer
    #: active): this says what to read instead of failing.
    recover: Callable[[SvcError], Recovery[T] | None] | None = None
    timeout: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    def content(self) -> bytes | None:
        return dumps(self.body) if self.has_body else None

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.has_body:
            headers["Content-Type"] = MEDIA_TYPE
        return headers

    def query(self) -> dict[str, str] | None:
        if not self.params:
            return None
        out: dict[str, str] = {}
        for key, value in self.params.items():
            if value is None:
                continue
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                out[key] = ",".join(str(v) for v in value)
            else:
                out[key] = str(value)
        return out or None


def transport_error(exc: httpx.HTTPError) -> TransportError:
    """Maps an httpx failure; ``sent`` is False only when nothing reached the server."""
    not_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
    text = str(exc) or type(exc).__name__
    return TransportError(f"{type(exc).__name__}: {text}", sent=not not_sent, cause=exc)


def read_response(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer, or raises the error it carries."""
    if 200 <= response.status_code < 300:
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise SvcError(
                f"the server answered {response.status_code} with a body that is not JSON",
                code="invalid_response",
                status=response.status_code,
                request_id=response.headers.get("x-request-id"),
            ) from exc
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = None
    retry_after: float | None = None
    header = response.headers.get("retry-after")
    if header:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None
    return _raise(error_from_response(
        response.status_code,
        body,
        request_id=response.headers.get("x-request-id"),
        retry_after=retry_after,
    ))


def _raise(exc: SvcError) -> Any:
    raise exc


def not_applied(exc: SvcError) -> bool:
    """Whether the failure shows the request changed nothing on the server."""
    if isinstance(exc, TransportError):
        return not exc.sent
    # 429 comes before anything is done; the 503 reasons of OverloadedError
    # refuse work before it is applied.
    return isinstance(exc, (RateLimitedError, OverloadedError))


def may_have_applied(exc: SvcError) -> bool:
    """Whether the request's fate is unknown after this failure."""
    if isinstance(exc, TransportError):
        return exc.sent
    return isinstance(exc, ServerTimeoutError) or (
        isinstance(exc, UnavailableError) and not isinstance(exc, (OverloadedError, QueuePausedError))
    )


def transient(exc: SvcError) -> bool:
    """Whether trying again later could succeed."""
    if isinstance(exc, QueuePausedError):
        # An operator's pause lasts as long as they like: the caller decides.
        return False
    if isinstance(exc, TransportError):
        return True
    if isinstance(exc, (RateLimitedError, UnavailableError)):
        return exc.retryable or isinstance(exc, ServerTimeoutError)
    return False


class Retrier:
    """The retry decisions for one call, shared by the sync and async clients."""

    def __init__(self, config: RetryConfig, safety: Safety, clock: Callable[[], float]) -> None:
        self.config = config
        self.safety = safety
        self.clock = clock
        self.started = clock()
        self.tries = 0
        #: A try may have been applied: a later error may mean it landed.
        self.ambiguous = False

    def failed(self, exc: SvcError) -> float | None:
        """Records a failed try: the delay before the next one, or ``None`` to give up."""
        self.tries += 1
        if may_have_applied(exc):
            self.ambiguous = True
        if not transient(exc):
            return None
        if self.safety is Safety.UNSAFE and not not_applied(exc):
            return None
        if self.tries >= self.config.attempts:
            return None
        delay = self.config.delay(self.tries, exc.retry_after)
        if self.clock() - self.started + delay > self.config.max_elapsed:
            return None
        return delay


def base_headers(api_key: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    out = {"User-Agent": USER_AGENT, "Accept": MEDIA_TYPE}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    if headers:
        out.update(headers)
    return out


def api_base(url: str) -> str:
    """The API root for a server URL (``http://host:port`` or ``.../svc/v1``)."""
    base = url.rstrip("/")
    if base.endswith(API_PREFIX):
        return base
    return base + API_PREFIX


def server_root(url: str) -> str:
    base = url.rstrip("/")
    if base.endswith(API_PREFIX):
        return base[: -len(API_PREFIX)]
    return base
