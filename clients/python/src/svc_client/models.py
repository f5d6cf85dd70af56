"""Typed views of what svc sends and takes.

Every response object keeps the whole JSON it was read from in ``raw``, so
fields this version does not model are still at hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, TypeVar, Union

from ._wire import (
    Duration,
    Timestamp,
    format_duration,
    format_timestamp,
    parse_duration,
    parse_timestamp,
    relative_timestamp,
    to_millis,
    to_seconds,
)
from .errors import SvcError, error_from_item

JobState = Literal[
    "scheduled", "available", "pending", "active", "retryable", "completed", "discarded", "cancelled"
]
#: States a job never leaves.
TERMINAL_STATES: frozenset[str] = frozenset({"completed", "discarded", "cancelled"})

OnConflict = Literal["reject", "ignore", "replace"]
OnExhaustion = Literal["discard", "dead_letter"]
OverlapPolicy = Literal["skip", "allow", "cancel_previous", "enqueue"]
WorkerState = Literal["running", "quiet", "terminate"]

T = TypeVar("T")


def _opt_duration(value: Any) -> timedelta | None:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            return None
    return None


def _ts(data: Mapping[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    return parse_timestamp(value) if isinstance(value, str) else None


def _int(data: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(data: Mapping[str, Any], key: str, default: str = "") -> str:
    value = data.get(key)
    return value if isinstance(value, str) else default


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


# --------------------------------------------------------------------------
# Policies (sent with a job, and read back from it)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """A job's retry policy; unset fields take the server's default.

    Durations are seconds, ``timedelta`` or ISO 8601 text; read back from a
    job they are ``timedelta``.
    """

    max_attempts: int | None = None
    initial_interval: Duration | None = None
    backoff_coefficient: float | None = None
    max_interval: Duration | None = None
    jitter: bool | None = None
    non_retryable_errors: Sequence[str] | None = None
    on_exhaustion: OnExhaustion | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_attempts is not None:
            out["max_attempts"] = self.max_attempts
        if self.initial_interval is not None:
            out["initial_interval"] = format_duration(self.initial_interval)
        if self.backoff_coefficient is not None:
            out["backoff_coefficient"] = self.backoff_coefficient
        if self.max_interval is not None:
            out["max_interval"] = format_duration(self.max_interval)
        if self.jitter is not None:
            out["jitter"] = self.jitter
        if self.non_retryable_errors is not None:
            out["non_retryable_errors"] = list(self.non_retryable_errors)
        if self.on_exhaustion is not None:
            out["on_exhaustion"] = self.on_exhaustion
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetryPolicy:
        coefficient = data.get("backoff_coefficient")
        jitter = data.get("jitter")
        errors = data.get("non_retryable_errors")
        exhaustion = data.get("on_exhaustion")
        return cls(
            max_attempts=_opt_int(data, "max_attempts"),
            initial_interval=_opt_duration(data.get("initial_interval")),
            backoff_coefficient=float(coefficient) if isinstance(coefficient, (int, float)) else None,
            max_interval=_opt_duration(data.get("max_interval")),
            jitter=jitter if isinstance(jitter, bool) else None,
            non_retryable_errors=[str(e) for e in errors] if isinstance(errors, list) else None,
            on_exhaustion=exhaustion if exhaustion in ("discard", "dead_letter") else None,
        )


@dataclass(frozen=True)
class UniquePolicy:
    """Keeps a job unique among the jobs svc holds (``options.unique``).

    ``key`` names parts of ``args`` (default: the whole ``args``; ``[]``:
    the type alone); ``period`` limits the check to jobs created that recently.
    """

    key: Sequence[str] | None = None
    period: Duration | None = None
    on_conflict: OnConflict | None = None
    states: Sequence[JobState] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key is not None:
            out["key"] = list(self.key)
        if self.period is not None:
            out["period"] = format_duration(self.period)
        if self.on_conflict is not None:
            out["on_conflict"] = self.on_conflict
        if self.states is not None:
            out["states"] = list(self.states)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UniquePolicy:
        key = data.get("key")
        states = data.get("states")
        on_conflict = data.get("on_conflict")
        return cls(
            key=[str(k) for k in key] if isinstance(key, list) else None,
            period=_opt_duration(data.get("period")),
            on_conflict=on_conflict if on_conflict in ("reject", "ignore", "replace") else None,
            states=list(states) if isinstance(states, list) else None,
        )


@dataclass(frozen=True)
class RateLimit:
    """A dispatch limit (``options.rate_limit``): how many jobs under ``key``
    may be active at once (``concurrency``) or claimed per window."""

    key: str | None = None
    concurrency: int | None = None
    max_per_second: int | None = None
    rate: int | None = None
    period: Literal["second", "minute", "hour"] | None = None
    on_limit: Literal["wait"] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("key", "concurrency", "max_per_second", "rate", "period", "on_limit"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RateLimit:
        period = data.get("period")
        return cls(
            key=_opt_str(data, "key"),
            concurrency=_opt_int(data, "concurrency"),
            max_per_second=_opt_int(data, "max_per_second"),
            rate=_opt_int(data, "rate"),
            period=period if period in ("second", "minute", "hour") else None,
            on_limit="wait" if data.get("on_limit") == "wait" else None,
        )


PolicyInput = Union[RetryPolicy, Mapping[str, Any]]
UniqueInput = Union[UniquePolicy, Mapping[str, Any]]
RateLimitInput = Union[RateLimit, Mapping[str, Any]]


def _policy_json(value: Any) -> dict[str, Any]:
    if isinstance(value, (RetryPolicy, UniquePolicy, RateLimit)):
        return value.to_json()
    if isinstance(value, Mapping):
        return {k: (format_duration(v) if isinstance(v, timedelta) else v) for k, v in value.items()}
    raise TypeError(f"expected a policy object or a mapping, got {type(value).__name__}")


# --------------------------------------------------------------------------
# What to enqueue
# --------------------------------------------------------------------------


@dataclass
class JobSpec:
    """One job to enqueue: the item of :meth:`Client.enqueue_batch`, a
    workflow step or callback. The options are those of ``POST /jobs``:

    - ``queue``, ``priority`` (-100..100, higher first), ``tags``, ``meta``;
    - ``delay`` (from the server's now) or ``scheduled_at`` (a time);
    - ``expires_at`` (a time) or ``ttl`` (counted from when the job is due);
    - ``timeout`` and ``visibility_timeout`` (sent as ``timeout_ms`` and
      ``visibility_timeout_ms``);
    - ``retry``, ``unique``, ``rate_limit`` (policy objects or mappings);
    - ``schema`` (a registered JSON Schema URI ``args`` must match);
    - ``pending`` (stage the job until ``activate``);
    - ``id`` (a client-chosen UUIDv7; makes the enqueue safe to retry);
    - ``traceparent`` (W3C trace context, carried in ``meta.traceparent``);
    - ``extra``: further top-level fields, kept and echoed back by svc.
    """

    type: str
    args: Sequence[Any] = ()
    id: str | None = None
    queue: str | None = None
    priority: int | None = None
    delay: Duration | None = None
    scheduled_at: Timestamp | None = None
    expires_at: Timestamp | None = None
    ttl: Duration | None = None
    retry: PolicyInput | None = None
    unique: UniqueInput | None = None
    tags: Sequence[str] | None = None
    timeout: Duration | None = None
    visibility_timeout: Duration | None = None
    meta: Mapping[str, Any] | None = None
    schema: str | None = None
    rate_limit: RateLimitInput | None = None
    pending: bool | None = None
    traceparent: str | None = None
    extra: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The enqueue body for this job."""
        if not isinstance(self.type, str) or not self.type:
            raise ValueError("a job needs a type")
        if isinstance(self.args, (str, bytes)) or not isinstance(self.args, Sequence):
            raise TypeError("args must be a list or tuple of JSON values")
        if self.delay is not None and self.scheduled_at is not None:
            raise ValueError("give delay or scheduled_at, not both")
        if self.ttl is not None and self.expires_at is not None:
            raise ValueError("give ttl or expires_at, not both")
        body: dict[str, Any] = dict(self.extra or {})
        body["type"] = self.type
        body["args"] = list(self.args)
        if self.id is not None:
            body["id"] = self.id
        meta = dict(self.meta or {})
        if self.traceparent is not None:
            meta["traceparent"] = self.traceparent
        if meta or self.meta is not None:
            body["meta"] = meta
        if self.schema is not None:
            body["schema"] = self.schema
        options: dict[str, Any] = {}
        if self.queue is not None:
            options["queue"] = self.queue
        if self.priority is not None:
            options["priority"] = self.priority
        if self.delay is not None:
            options["scheduled_at"] = relative_timestamp(to_seconds(self.delay))
        elif self.scheduled_at is not None:
            options["scheduled_at"] = format_timestamp(self.scheduled_at)
        if self.expires_at is not None:
            options["expires_at"] = format_timestamp(self.expires_at)
        elif self.ttl is not None:
            ttl = to_seconds(self.ttl)
            if self.scheduled_at is None:
                start = to_seconds(self.delay) if self.delay is not None else 0.0
                options["expires_at"] = relative_timestamp(start + ttl)
            elif isinstance(self.scheduled_at, datetime):
                options["expires_at"] = format_timestamp(self.scheduled_at + timedelta(seconds=ttl))
            else:
                raise ValueError("ttl needs scheduled_at as a datetime (or use expires_at)")
        if self.timeout is not None:
            options["timeout_ms"] = to_millis(self.timeout)
        if self.visibility_timeout is not None:
            options["visibility_timeout_ms"] = to_millis(self.visibility_timeout)
        if self.retry is not None:
            options["retry"] = _policy_json(self.retry)
        if self.unique is not None:
            options["unique"] = _policy_json(self.unique)
        if self.rate_limit is not None:
            options["rate_limit"] = _policy_json(self.rate_limit)
        if self.tags is not None:
            if isinstance(self.tags, str):
                raise TypeError("tags must be a list of strings")
            options["tags"] = list(self.tags)
        if self.pending is not None:
            options["pending"] = self.pending
        if options:
            extra_options = body.get("options")
            if isinstance(extra_options, Mapping):
                options = {**extra_options, **options}
            body["options"] = options
        return body


JobInput = Union[JobSpec, Mapping[str, Any]]


def job_body(item: JobInput) -> dict[str, Any]:
    """The enqueue body of a :class:`JobSpec` or of a mapping given as is."""
    if isinstance(item, JobSpec):
        return item.to_json()
    if isinstance(item, Mapping):
        body = dict(item)
        if "type" not in body:
            raise ValueError("a job needs a type")
        body.setdefault("args", [])
        return body
    raise TypeError(f"expected a JobSpec or a mapping, got {type(item).__name__}")


# --------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A failure report: a job's ``error``, or one of its ``errors``."""

    type: str
    message: str
    code: str | None = None
    retryable: bool | None = None
    backtrace: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    attempt: int | None = None
    occurred_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        retryable = data.get("retryable")
        return cls(
            type=_str(data, "type") or _str(data, "code"),
            message=_str(data, "message"),
            code=_opt_str(data, "code"),
            retryable=retryable if isinstance(retryable, bool) else None,
            backtrace=[str(x) for x in _list(data.get("backtrace"))],
            details=_dict(data.get("details")),
            attempt=_opt_int(data, "attempt"),
            occurred_at=_ts(data, "occurred_at"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Job:
    """A job as svc shows it. Times are aware ``datetime`` in UTC."""

    id: str
    type: str
    queue: str
    args: list[Any]
    meta: dict[str, Any]
    state: str
    priority: int
    attempt: int
    max_attempts: int
    timeout_ms: int
    visibility_timeout_ms: int
    retry: RetryPolicy
    tags: list[str]
    created_at: datetime | None
    unique: UniquePolicy | None = None
    unique_key: str | None = None
    rate_limit: RateLimit | None = None
    scheduled_at: datetime | None = None
    expires_at: datetime | None = None
    enqueued_at: datetime | None = None
    activated_at: datetime | None = None
    started_at: datetime | None = None
    worker_id: str | None = None
    completed_at: datetime | None = None
    cancelled_at: datetime | None = None
    discarded_at: datetime | None = None
    retry_at: datetime | None = None
    retry_delay_ms: int | None = None
    progress: float | None = None
    progress_message: str | None = None
    result: Any = None
    error: Failure | None = None
    errors: list[Failure] = field(default_factory=list)
    workflow_id: str | None = None
    parent_results: list[Any] | None = None
    parent_states: list[str | None] | None = None
    previous_state: str | None = None
    deduplicated: bool = False
    schema: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (completed, discarded or cancelled)."""
        return self.state in TERMINAL_STATES

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` the producer put in ``meta``, if any."""
        value = self.meta.get("traceparent")
        return value if isinstance(value, str) else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        unique = data.get("unique")
        rate_limit = data.get("rate_limit")
        error = data.get("error")
        progress = data.get("progress")
        parent_results = data.get("parent_results")
        parent_states = data.get("parent_states")
        return cls(
            id=_str(data, "id"),
            type=_str(data, "type"),
            queue=_str(data, "queue"),
            args=_list(data.get("args")),
            meta=_dict(data.get("meta")),
            state=_str(data, "state"),
            priority=_int(data, "priority"),
            attempt=_int(data, "attempt"),
            max_attempts=_int(data, "max_attempts"),
            timeout_ms=_int(data, "timeout_ms"),
            visibility_timeout_ms=_int(data, "visibility_timeout_ms"),
            retry=RetryPolicy.from_json(_dict(data.get("retry"))),
            tags=[str(t) for t in _list(data.get("tags"))],
            created_at=_ts(data, "created_at"),
            unique=UniquePolicy.from_json(unique) if isinstance(unique, Mapping) else None,
            unique_key=_opt_str(data, "unique_key"),
            rate_limit=RateLimit.from_json(rate_limit) if isinstance(rate_limit, Mapping) else None,
            scheduled_at=_ts(data, "scheduled_at"),
            expires_at=_ts(data, "expires_at"),
            enqueued_at=_ts(data, "enqueued_at"),
            activated_at=_ts(data, "activated_at"),
            started_at=_ts(data, "started_at"),
            worker_id=_opt_str(data, "worker_id"),
            completed_at=_ts(data, "completed_at"),
            cancelled_at=_ts(data, "cancelled_at"),
            discarded_at=_ts(data, "discarded_at"),
            retry_at=_ts(data, "retry_at"),
            retry_delay_ms=_opt_int(data, "retry_delay_ms"),
            progress=float(progress) if isinstance(progress, (int, float)) and not isinstance(progress, bool) else None,
            progress_message=_opt_str(data, "progress_message"),
            result=data.get("result"),
            error=Failure.from_json(error) if isinstance(error, Mapping) else None,
            errors=[Failure.from_json(e) for e in _list(data.get("errors")) if isinstance(e, Mapping)],
            workflow_id=_opt_str(data, "workflow_id"),
            parent_results=list(parent_results) if isinstance(parent_results, list) else None,
            parent_states=list(parent_states) if isinstance(parent_states, list) else None,
            previous_state=_opt_str(data, "previous_state"),
            deduplicated=data.get("deduplicated") is True,
            schema=_opt_str(data, "schema"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class JobProgress:
    """``GET /jobs/{id}/progress``: the current attempt's last report
    (``progress``, ``message``, ``data`` are ``None`` until it reports)."""

    job_id: str
    state: str
    attempt: int
    progress: float | None
    message: str | None
    data: Any
    updated_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobProgress:
        progress = data.get("progress")
        return cls(
            job_id=_str(data, "job_id"),
            state=_str(data, "state"),
            attempt=_int(data, "attempt"),
            progress=float(progress) if isinstance(progress, (int, float)) and not isinstance(progress, bool) else None,
            message=_opt_str(data, "message"),
            data=data.get("data"),
            updated_at=_ts(data, "updated_at"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; pass ``cursor`` to the next call while ``has_more``."""

    items: list[T]
    cursor: str | None
    has_more: bool

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


# --------------------------------------------------------------------------
# Workflows
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowMember:
    """A job of a workflow (a chain's step, a group's or batch's job), or a fired callback."""

    type: str
    queue: str
    index: int | None = None
    job_id: str | None = None
    state: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkflowMember:
        return cls(
            type=_str(data, "type"),
            queue=_str(data, "queue"),
            index=_opt_int(data, "index"),
            job_id=_opt_str(data, "job_id"),
            state=_opt_str(data, "state"),
        )


@dataclass(frozen=True)
class Workflow:
    """A chain, group or batch and the states of its jobs."""

    id: str
    name: str | None
    type: str
    state: str
    steps_total: int
    steps_completed: int
    jobs_total: int
    jobs_completed: int
    jobs_failed: int
    created_at: datetime | None
    members: list[WorkflowMember]
    callbacks: dict[str, WorkflowMember] = field(default_factory=dict)
    completed_at: datetime | None = None
    cancelled_at: datetime | None = None
    failure: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def job_ids(self) -> list[str]:
        return [m.job_id for m in self.members if m.job_id]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Workflow:
        members = data.get("steps") if isinstance(data.get("steps"), list) else data.get("jobs")
        callbacks = _dict(data.get("callbacks"))
        failure = data.get("failure")
        return cls(
            id=_str(data, "id"),
            name=_opt_str(data, "name"),
            type=_str(data, "type"),
            state=_str(data, "state"),
            steps_total=_int(data, "steps_total"),
            steps_completed=_int(data, "steps_completed"),
            jobs_total=_int(data, "jobs_total"),
            jobs_completed=_int(data, "jobs_completed"),
            jobs_failed=_int(data, "jobs_failed"),
            created_at=_ts(data, "created_at"),
            members=[WorkflowMember.from_json(m) for m in _list(members) if isinstance(m, Mapping)],
            callbacks={k: WorkflowMember.from_json(v) for k, v in callbacks.items() if isinstance(v, Mapping)},
            completed_at=_ts(data, "completed_at"),
            cancelled_at=_ts(data, "cancelled_at"),
            failure=dict(failure) if isinstance(failure, Mapping) else None,
            raw=dict(data),
        )


# --------------------------------------------------------------------------
# Cron, queues, workers, webhooks
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CronEntry:
    """A registered cron entry."""

    name: str
    schedule: str
    timezone: str
    type: str
    args: list[Any]
    queue: str
    meta: dict[str, Any]
    options: dict[str, Any]
    overlap_policy: str
    enabled: bool
    status: str
    run_count: int
    created_at: datetime | None
    updated_at: datetime | None
    next_run_at: datetime | None = None
    last_run_at: datetime | None = None
    last_job_id: str | None = None
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CronEntry:
        return cls(
            name=_str(data, "name"),
            schedule=_str(data, "schedule") or _str(data, "expression"),
            timezone=_str(data, "timezone", "UTC"),
            type=_str(data, "type"),
            args=_list(data.get("args")),
            queue=_str(data, "queue"),
            meta=_dict(data.get("meta")),
            options=_dict(data.get("options")),
            overlap_policy=_str(data, "overlap_policy"),
            enabled=data.get("enabled") is not False,
            status=_str(data, "status"),
            run_count=_int(data, "run_count"),
            created_at=_ts(data, "created_at"),
            updated_at=_ts(data, "updated_at"),
            next_run_at=_ts(data, "next_run_at"),
            last_run_at=_ts(data, "last_run_at"),
            last_job_id=_opt_str(data, "last_job_id"),
            description=_opt_str(data, "description"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class QueueSummary:
    """A queue in ``GET /queues``: jobs not yet finished (``size``) and whether paused."""

    name: str
    size: int
    paused: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueSummary:
        return cls(name=_str(data, "name"), size=_int(data, "size"), paused=data.get("paused") is True)


@dataclass(frozen=True)
class QueueStats:
    """``GET /queues/{name}/stats``: jobs by state and the last minute's throughput."""

    queue: str
    size: int
    paused: bool
    states: dict[str, int]
    completed_last_minute: int
    failed_last_minute: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueStats:
        throughput = _dict(data.get("throughput"))
        states = _dict(data.get("states"))
        return cls(
            queue=_str(data, "queue"),
            size=_int(data, "size"),
            paused=data.get("paused") is True,
            states={str(k): int(v) for k, v in states.items() if isinstance(v, int)},
            completed_last_minute=_int(throughput, "completed_last_minute"),
            failed_last_minute=_int(throughput, "failed_last_minute"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class WorkerInfo:
    """A worker in svc's registry."""

    worker_id: str
    state: str
    active_job_ids: list[str]
    stale: bool
    first_seen_at: datetime | None = None
    last_seen_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerInfo:
        return cls(
            worker_id=_str(data, "worker_id"),
            state=_str(data, "state"),
            active_job_ids=[str(x) for x in _list(data.get("active_job_ids"))],
            stale=data.get("stale") is True,
            first_seen_at=_ts(data, "first_seen_at"),
            last_seen_at=_ts(data, "last_seen_at"),
            last_heartbeat_at=_ts(data, "last_heartbeat_at"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class HeartbeatReply:
    """What a heartbeat answered: ``state`` is what the worker should do."""

    state: str
    jobs_extended: int
    server_time: datetime | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HeartbeatReply:
        return cls(
            state=_str(data, "state", "running"),
            jobs_extended=_int(data, "jobs_extended"),
            server_time=_ts(data, "server_time"),
        )


@dataclass(frozen=True)
class FetchSpec:
    """What an ack claims next (``fetch`` of ``POST /workers/ack``): up to
    ``count`` jobs of ``queues`` (most important first), waiting up to
    ``wait`` seconds (20 at most) for one after the ack is committed.
    ``visibility_timeout`` overrides the claimed jobs' own."""

    queues: Sequence[str]
    count: int = 1
    wait: float = 0.0
    visibility_timeout: Duration | None = None

    def to_json(self) -> dict[str, Any]:
        return fetch_body(
            self.queues,
            self.count,
            wait_ms=int(self.wait * 1000),
            visibility_timeout_ms=to_millis(self.visibility_timeout) if self.visibility_timeout is not None else None,
        )


#: A fetch to attach to an ack: a :class:`FetchSpec`, or a fetch body sent as is.
FetchInput = Union[FetchSpec, Mapping[str, Any]]

#: One job of :meth:`Client.ack_many <svc_client.Client.ack_many>`: its id,
#: ``(id, result)``, or ``{"job_id": ..., "result": ...}``.
AckInput = Union[str, tuple[str, Any], Mapping[str, Any]]


def fetch_body(
    queues: Sequence[str],
    count: int = 1,
    worker_id: str | None = None,
    wait_ms: int = 0,
    visibility_timeout_ms: int | None = None,
) -> dict[str, Any]:
    """A fetch body (``POST /workers/fetch``, or an ack's ``fetch``)."""
    if isinstance(queues, str):
        queues = [queues]
    body: dict[str, Any] = {"queues": list(queues), "count": max(1, min(int(count), 100))}
    if worker_id is not None:
        body["worker_id"] = worker_id
    if wait_ms:
        body["wait_ms"] = max(0, min(int(wait_ms), 20_000))
    if visibility_timeout_ms is not None:
        body["visibility_timeout_ms"] = visibility_timeout_ms
    return body


def fetch_json(fetch: FetchInput) -> dict[str, Any]:
    if isinstance(fetch, FetchSpec):
        return fetch.to_json()
    if isinstance(fetch, Mapping):
        return dict(fetch)
    raise TypeError("fetch must be a FetchSpec or a mapping")


def ack_item_json(item: AckInput) -> dict[str, Any]:
    if isinstance(item, str):
        return {"job_id": item}
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        entry: dict[str, Any] = {"job_id": item[0]}
        if item[1] is not None:
            entry["result"] = item[1]
        return entry
    if isinstance(item, Mapping):
        return dict(item)
    raise TypeError("an ack is a job id, (job_id, result), or a mapping with job_id and result")


@dataclass(frozen=True)
class AckOutcome:
    """How one ack of :meth:`Client.ack_many <svc_client.Client.ack_many>` went.

    ``acknowledged`` jobs carry their ``state`` (``completed``) and
    ``completed_at``; a refused one carries ``error``, the exception a
    one-job ack would have raised (a :class:`~svc_client.ConflictError` for
    a job no longer active or held by another worker, a
    :class:`~svc_client.NotFoundError` for an unknown one).
    """

    job_id: str
    acknowledged: bool
    state: str | None = None
    completed_at: datetime | None = None
    error: SvcError | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AckOutcome:
        acknowledged = data.get("acknowledged") is True
        return cls(
            job_id=_str(data, "job_id"),
            acknowledged=acknowledged,
            state=_opt_str(data, "state"),
            completed_at=_ts(data, "completed_at"),
            error=None if acknowledged else error_from_item(data.get("error")),
            raw=dict(data),
        )


@dataclass(frozen=True)
class AckManyResult:
    """The answer to an ack of several jobs: each ack's outcome, in the
    order sent, and the jobs its ``fetch`` claimed."""

    acks: list[AckOutcome]
    jobs: list[Job]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def refused(self) -> list[AckOutcome]:
        """The acks that did not go through."""
        return [a for a in self.acks if not a.acknowledged]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AckManyResult:
        return cls(
            acks=[AckOutcome.from_json(a) for a in _list(data.get("acks")) if isinstance(a, Mapping)],
            jobs=[Job.from_json(j) for j in _list(data.get("jobs")) if isinstance(j, Mapping)],
            raw=dict(data),
        )


@dataclass(frozen=True)
class WebhookSubscription:
    """A webhook subscription (its secret is never shown)."""

    id: str
    url: str
    events: list[str]
    active: bool
    metadata: dict[str, Any]
    filter: dict[str, Any] | None
    created_at: datetime | None
    updated_at: datetime | None
    secret_rotation: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WebhookSubscription:
        flt = data.get("filter")
        rotation = data.get("secret_rotation")
        return cls(
            id=_str(data, "id"),
            url=_str(data, "url"),
            events=[str(e) for e in _list(data.get("events"))],
            active=data.get("active") is not False,
            metadata=_dict(data.get("metadata")),
            filter=dict(flt) if isinstance(flt, Mapping) else None,
            created_at=_ts(data, "created_at"),
            updated_at=_ts(data, "updated_at"),
            secret_rotation=dict(rotation) if isinstance(rotation, Mapping) else None,
            raw=dict(data),
        )
