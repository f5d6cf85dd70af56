"""The exceptions the client raises.

Every failure is an :class:`SvcError`. An answer from the server carries its
error body (``code``, ``message``, ``retryable``, ``details``,
``request_id``) and the HTTP ``status``; a request that got no answer is a
:class:`TransportError` (``status`` is ``None``).
"""

from __future__ import annotations

from typing import Any, Mapping


class SvcError(Exception):
    """Base class of every error this library raises.

    Attributes:
        code: svc's error code (``not_found``, ``duplicate``, ...), or
            ``transport_error`` when no answer came.
        message: the server's message.
        retryable: what the server says about trying again.
        details: more about the error (``field``, ``reason``, ``existing_job_id``, ...).
        request_id: the request's ``X-Request-Id``.
        status: the HTTP status, or ``None`` when no answer came.
        retry_after: seconds from the ``Retry-After`` header, when sent.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        retryable: bool = False,
        details: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.status = status
        self.retry_after = retry_after

    @property
    def reason(self) -> str | None:
        """``details.reason`` when the server gave one."""
        value = self.details.get("reason")
        return value if isinstance(value, str) else None

    def __str__(self) -> str:
        where = f"{self.status} {self.code}" if self.status is not None else self.code
        extra = f" (request {self.request_id})" if self.request_id else ""
        return f"{where}: {self.message}{extra}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, "
            f"message={self.message!r}, details={self.details!r})"
        )


class TransportError(SvcError):
    """No answer: connection refused or reset, a timeout, a broken response.

    ``sent`` tells whether the request may have reached the server (a refused
    connection never did; a reset after sending may have been applied).
    """

    def __init__(self, message: str, *, sent: bool, cause: BaseException | None = None) -> None:
        super().__init__(message, code="transport_error", retryable=True)
        self.sent = sent
        self.__cause__ = cause


class ValidationError(SvcError):
    """400: the request or a job in it is malformed (``invalid_request``,
    ``invalid_payload``, ``schema_validation``)."""


class PayloadTooLargeError(ValidationError):
    """413 ``envelope_too_large``: a body, job, ``meta`` or result over its size limit."""


class UnsupportedError(SvcError):
    """422 ``unsupported``: a feature or API version this server does not offer."""


class AuthError(SvcError):
    """401 or 403."""


class UnauthorizedError(AuthError):
    """401 ``unauthorized``: the key is missing, malformed or unknown."""


class ForbiddenError(AuthError):
    """403 ``forbidden``: the key's role may not do this (or a refused origin or host)."""


class NotFoundError(SvcError):
    """404 ``not_found``: no such job, workflow, cron entry, queue, ... (or route)."""


class MethodNotAllowedError(SvcError):
    """405 ``method_not_allowed``."""


class ConflictError(SvcError):
    """409: the resource is in a state that refuses the operation.

    ``details.current_state`` and ``details.reason`` (``invalid_state``,
    ``not_owner``, ``not_pending``, ``owned``, ``limit``, ...) say why.
    """

    @property
    def current_state(self) -> str | None:
        value = self.details.get("current_state")
        return value if isinstance(value, str) else None


class DuplicateError(ConflictError):
    """409 ``duplicate``: a job id in use, or a unique policy (``reject``) met a held job."""

    @property
    def existing_job_id(self) -> str | None:
        value = self.details.get("existing_job_id")
        return value if isinstance(value, str) else None


class RateLimitedError(SvcError):
    """429 ``rate_limited``; ``retry_after`` says when to come back."""


class UnavailableError(SvcError):
    """503 (or 504): the server cannot take the request now."""


class OverloadedError(UnavailableError):
    """503 whose reason shows the request was refused before it was applied:
    ``overloaded``, ``capacity``, ``disk_full``, ``connections``,
    ``connections_per_address``."""


class QueuePausedError(UnavailableError):
    """503 ``queue_paused``: the target queue refuses new work until resumed.

    Not retried automatically: a pause lasts as long as the operator wants.
    """


class ServerTimeoutError(UnavailableError):
    """504 ``timeout``: the server gave up on the request (it may have been applied)."""


#: 503 reasons that prove the request was refused before it changed anything.
NOT_APPLIED_REASONS = frozenset(
    {"overloaded", "capacity", "disk_full", "connections", "connections_per_address"}
)


def error_from_response(
    status: int,
    body: Any,
    *,
    request_id: str | None = None,
    retry_after: float | None = None,
) -> SvcError:
    """Builds the exception for an error answer."""
    err: Mapping[str, Any] = {}
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        err = body["error"]
    code = str(err.get("code") or _default_code(status))
    message = str(err.get("message") or f"HTTP {status}")
    retryable = bool(err.get("retryable", status in (429, 503, 504)))
    details = err.get("details") if isinstance(err.get("details"), Mapping) else {}
    rid = err.get("request_id") if isinstance(err.get("request_id"), str) else request_id
    cls = _class_for(status, code, details or {})
    return cls(
        message,
        code=code,
        retryable=retryable,
        details=details,
        request_id=rid,
        status=status,
        retry_after=retry_after,
    )


#: The HTTP status each error code comes with, for errors reported inside
#: a 200 answer (an ack of several jobs reports each refusal on its own).
_STATUS_OF_CODE = {
    "invalid_request": 400,
    "invalid_payload": 400,
    "schema_validation": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "duplicate": 409,
    "envelope_too_large": 413,
    "unsupported": 422,
    "rate_limited": 429,
    "timeout": 504,
}


def error_from_item(err: Any) -> SvcError:
    """The exception for an error object reported for one item of a request
    (``{code, message, retryable, details}``): the one a request for that
    item alone would have raised."""
    if not isinstance(err, Mapping):
        err = {}
    code = str(err.get("code") or "error")
    status = _STATUS_OF_CODE.get(code)
    message = str(err.get("message") or code)
    details = err.get("details") if isinstance(err.get("details"), Mapping) else {}
    cls = _class_for(status, code, details or {}) if status is not None else SvcError
    return cls(message, code=code, retryable=err.get("retryable") is True, details=details, status=status)


def _default_code(status: int) -> str:
    return {
        400: "invalid_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        405: "method_not_allowed",
        409: "conflict",
        413: "envelope_too_large",
        422: "unsupported",
        429: "rate_limited",
        503: "backend_error",
        504: "timeout",
    }.get(status, "error")


def _class_for(status: int, code: str, details: Mapping[str, Any]) -> type[SvcError]:
    if code == "duplicate":
        return DuplicateError
    if code == "queue_paused":
        return QueuePausedError
    if status == 413 or code == "envelope_too_large":
        return PayloadTooLargeError
    if status == 400:
        return ValidationError
    if status == 401:
        return UnauthorizedError
    if status == 403:
        return ForbiddenError
    if status == 404:
        return NotFoundError
    if status == 405:
        return MethodNotAllowedError
    if status == 409:
        return ConflictError
    if status == 422:
        return UnsupportedError
    if status == 429:
        return RateLimitedError
    if status == 503:
        if details.get("reason") in NOT_APPLIED_REASONS:
            return OverloadedError
        return UnavailableError
    if status == 504:
        return ServerTimeoutError
    return SvcError


class JobError(Exception):
    """Raise from a handler to choose how the job's failure is reported.

    ``type`` becomes the failure's type (default: this class's name),
    ``retryable=False`` makes the failure final whatever the retry policy
    says, and ``details`` are added to the report (``details.error_class``
    is matched by the policy's ``non_retryable_errors``).
    """

    def __init__(
        self,
        message: str,
        *,
        type: str | None = None,
        retryable: bool | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.retryable = retryable
        self.details: dict[str, Any] = dict(details or {})
