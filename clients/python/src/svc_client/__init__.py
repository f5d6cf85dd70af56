"""Python client for svc, the durable job-queue server.

- :class:`Client` / :class:`AsyncClient`: enqueue jobs, read and cancel
  them, manage workflows, cron entries, queues, the dead letter listing and
  webhook subscriptions.
- :class:`Worker`: fetch jobs and run handlers, with heartbeats, timeouts,
  graceful shutdown and reconnection.
- :class:`InlineClient`: run handlers in process, without a server, in tests.
"""

from ._transport import RetryConfig
from ._wire import format_duration, is_job_id, new_job_id, parse_duration
from .aio import AsyncClient
from .client import Client
from .context import JobCancelled, JobContext, current_job
from .errors import (
    AuthError,
    ConflictError,
    DuplicateError,
    ForbiddenError,
    JobError,
    MethodNotAllowedError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    QueuePausedError,
    RateLimitedError,
    ServerTimeoutError,
    SvcError,
    TransportError,
    UnauthorizedError,
    UnavailableError,
    UnsupportedError,
    ValidationError,
)
from .inline import InlineClient, InlineJobFailed
from .middleware import Middleware
from .models import (
    TERMINAL_STATES,
    AckManyResult,
    AckOutcome,
    CronEntry,
    Failure,
    FetchSpec,
    HeartbeatReply,
    Job,
    JobProgress,
    JobSpec,
    Page,
    QueueStats,
    QueueSummary,
    RateLimit,
    RetryPolicy,
    UniquePolicy,
    WebhookSubscription,
    WorkerInfo,
    Workflow,
    WorkflowMember,
)
from .tracing import current_traceparent, new_traceparent, use_traceparent
from .version import __version__
from .worker import Worker

__all__ = [
    "AckManyResult",
    "AckOutcome",
    "AsyncClient",
    "AuthError",
    "Client",
    "ConflictError",
    "CronEntry",
    "DuplicateError",
    "Failure",
    "FetchSpec",
    "ForbiddenError",
    "HeartbeatReply",
    "InlineClient",
    "InlineJobFailed",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobError",
    "JobProgress",
    "JobSpec",
    "MethodNotAllowedError",
    "Middleware",
    "NotFoundError",
    "OverloadedError",
    "Page",
    "PayloadTooLargeError",
    "QueuePausedError",
    "QueueStats",
    "QueueSummary",
    "RateLimit",
    "RateLimitedError",
    "RetryConfig",
    "RetryPolicy",
    "ServerTimeoutError",
    "SvcError",
    "TERMINAL_STATES",
    "TransportError",
    "UnauthorizedError",
    "UnavailableError",
    "UniquePolicy",
    "UnsupportedError",
    "ValidationError",
    "WebhookSubscription",
    "Worker",
    "WorkerInfo",
    "Workflow",
    "WorkflowMember",
    "__version__",
    "current_job",
    "current_traceparent",
    "format_duration",
    "is_job_id",
    "new_job_id",
    "new_traceparent",
    "parse_duration",
    "use_traceparent",
]
