"""What the sync and async clients share: settings and request bodies."""

from __future__ import annotations

import traceback
from typing import Any, Mapping, Sequence

import httpx

from . import tracing
from ._transport import RetryConfig, api_base, base_headers
from ._wire import new_job_id
from .errors import JobError
from .middleware import Middleware
from .models import JobInput, OverlapPolicy, job_body


class Settings:
    """A client's configuration (shared by :class:`Client` and :class:`AsyncClient`)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        timeout: float,
        retry: RetryConfig | None,
        headers: Mapping[str, str] | None,
        middleware: Sequence[Middleware],
        traceparent_provider: tracing.TraceparentProvider | None,
        auto_id: bool,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError("url must be an http:// or https:// URL of the svc server")
        self.url = url
        self.base_url = api_base(url)
        self.headers = base_headers(api_key, headers)
        self.timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self.retry = retry if retry is not None else RetryConfig()
        self.middleware = list(middleware)
        self.traceparent_provider = traceparent_provider
        self.auto_id = auto_id

    def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        """Adds the trace context and (with ``auto_id``) an id, then runs ``before_enqueue`` hooks."""
        meta = body.get("meta")
        if not isinstance(meta, Mapping) or "traceparent" not in meta:
            traceparent = tracing.resolve(None, self.traceparent_provider)
            if traceparent is not None:
                body["meta"] = {**(meta if isinstance(meta, Mapping) else {}), "traceparent": traceparent}
        if self.auto_id and not body.get("id"):
            body["id"] = new_job_id()
        for mw in self.middleware:
            mw.before_enqueue(body)
        return body

    def bodies(self, items: Sequence[JobInput]) -> list[dict[str, Any]]:
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise TypeError("expected a list of JobSpec or mappings")
        return [self.prepare(job_body(item)) for item in items]

    def workflow(
        self,
        kind: str,
        jobs: Sequence[JobInput],
        callbacks: Mapping[str, JobInput | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        if not jobs:
            raise ValueError(f"a {kind} needs at least one job")
        definition: dict[str, Any] = {"type": kind, ("steps" if kind == "chain" else "jobs"): self.bodies(jobs)}
        if callbacks:
            prepared = {k: self.prepare(job_body(v)) for k, v in callbacks.items() if v is not None}
            if prepared:
                definition["callbacks"] = prepared
        if options:
            definition["options"] = dict(options)
        return definition


def cron_body(
    name: str,
    schedule: str,
    type: str,
    args: Sequence[Any] | None,
    *,
    timezone: str | None,
    queue: str | None,
    meta: Mapping[str, Any] | None,
    options: Mapping[str, Any] | None,
    overlap_policy: OverlapPolicy | None,
    enabled: bool | None,
    description: str | None,
    schema: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "schedule": schedule, "type": type, "args": list(args or [])}
    for key, value in (
        ("timezone", timezone),
        ("queue", queue),
        ("meta", dict(meta) if meta is not None else None),
        ("options", dict(options) if options is not None else None),
        ("overlap_policy", overlap_policy),
        ("enabled", enabled),
        ("description", description),
        ("schema", schema),
    ):
        if value is not None:
            body[key] = value
    return body


def webhook_body(
    url: str | None = None,
    events: Sequence[str] | None = None,
    secret: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    filter: Mapping[str, Any] | None = None,
    active: bool | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if url is not None:
        body["url"] = url
    if events is not None:
        if isinstance(events, str):
            events = [events]
        body["events"] = list(events)
    if secret is not None:
        body["secret"] = secret
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if filter is not None:
        body["filter"] = dict(filter)
    if active is not None:
        body["active"] = active
    return body


def failure_body(error: BaseException | Mapping[str, Any], retryable: bool | None = None) -> dict[str, Any]:
    """A nack's ``error``: from an exception (type, message, traceback) or a mapping as is."""
    if isinstance(error, Mapping):
        body = dict(error)
        if "type" not in body and "code" not in body:
            body["type"] = "error"
        body.setdefault("message", "")
    else:
        cls = type(error)
        body = {
            "type": cls.__name__,
            "message": str(error) or cls.__name__,
            "backtrace": format_backtrace(error),
            "details": {"error_class": f"{cls.__module__}.{cls.__qualname__}"},
        }
        if isinstance(error, JobError):
            if error.type:
                body["type"] = error.type
            body["message"] = error.message
            body["details"].update(error.details)
            if retryable is None:
                retryable = error.retryable
    if retryable is not None:
        body["retryable"] = retryable
    return body


def format_backtrace(error: BaseException, limit: int = 50) -> list[str]:
    """The traceback of ``error`` as lines, innermost call last (at most ``limit`` frames)."""
    frames = traceback.extract_tb(error.__traceback__)[-limit:]
    lines = [
        f'File "{f.filename}", line {f.lineno}, in {f.name}' + (f": {f.line}" if f.line else "")
        for f in frames
    ]
    return lines
