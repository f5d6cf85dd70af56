"""Wire formats: ISO 8601 durations, RFC 3339 timestamps, UUIDv7 ids, JSON."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Union

#: A duration as the client accepts it: seconds, a ``timedelta``, or an
#: ISO 8601 string such as ``"PT1.5S"`` (sent as is).
Duration = Union[int, float, timedelta, str]

#: A point in time: an aware ``datetime`` (naive ones are taken as UTC) or an
#: RFC 3339 string (sent as is; ``"+PT5M"`` means five minutes from now).
Timestamp = Union[datetime, str]

_DURATION_RE = re.compile(
    r"^P(?:(?P<weeks>\d+(?:\.\d+)?)W)?(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def to_seconds(value: Duration) -> float:
    """Seconds in a duration given as a number, ``timedelta`` or ISO 8601 text."""
    if isinstance(value, bool):
        raise TypeError("a duration must be seconds, a timedelta or an ISO 8601 string")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, str):
        return parse_duration(value).total_seconds()
    raise TypeError("a duration must be seconds, a timedelta or an ISO 8601 string")


def to_millis(value: Duration) -> int:
    """Whole milliseconds (rounded up, at least 1) in a duration."""
    ms = to_seconds(value) * 1000.0
    whole = int(ms)
    if whole < ms:
        whole += 1
    return max(whole, 1)


def format_duration(value: Duration) -> str:
    """An ISO 8601 duration (``PT0.25S``, ``PT5M``, ``P7D``) for the wire."""
    if isinstance(value, str):
        return value
    total_ms = int(round(to_seconds(value) * 1000))
    if total_ms <= 0:
        raise ValueError("a duration must be more than 0")
    days, rest = divmod(total_ms, 86_400_000)
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    out = "P"
    if days:
        out += f"{days}D"
    time_part = ""
    if hours:
        time_part += f"{hours}H"
    if minutes:
        time_part += f"{minutes}M"
    if seconds or millis:
        if millis:
            time_part += f"{seconds}.{millis:03d}".rstrip("0") + "S"
        else:
            time_part += f"{seconds}S"
    if time_part:
        out += "T" + time_part
    return out


def parse_duration(text: str) -> timedelta:
    """Reads the ISO 8601 durations svc writes (weeks, days, hours, minutes, seconds)."""
    match = _DURATION_RE.match(text.strip().upper())
    if not match or text.strip().upper() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration this client reads: {text!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return timedelta(
        weeks=parts.get("weeks", 0.0),
        days=parts.get("days", 0.0),
        hours=parts.get("hours", 0.0),
        minutes=parts.get("minutes", 0.0),
        seconds=parts.get("seconds", 0.0),
    )


def format_timestamp(value: Timestamp) -> str:
    """RFC 3339 in UTC with milliseconds (``2025-01-02T03:04:05.678Z``)."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_timestamp(text: str | None) -> datetime | None:
    """Reads an RFC 3339 timestamp (with or without fractional seconds)."""
    if text is None:
        return None
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        parsed = _parse_timestamp_slow(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed


def _parse_timestamp_slow(value: str) -> datetime:
    # Python 3.10's fromisoformat takes 3 or 6 fractional digits only.
    match = re.match(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(.*)$", value)
    if match:
        frac = (match.group(2) or "")[:6].ljust(6, "0") if match.group(2) else ""
        value = match.group(1) + (f".{frac}" if frac else "") + match.group(3)
    return datetime.fromisoformat(value)


def relative_timestamp(seconds: float) -> str:
    """``+<duration>``: a time relative to the server's clock."""
    return "+" + format_duration(max(seconds, 0.001))


_uuid_lock = threading.Lock()
_uuid_last_ms = 0
_uuid_counter = 0


def new_job_id() -> str:
    """A fresh UUIDv7 (lower case), usable as a client-chosen job id.

    Ids made in one process increase strictly (a 12-bit counter fills the
    ``rand_a`` field within a millisecond). svc refuses an id more than an hour
    ahead of its clock, so the host's clock must be roughly right.
    """
    global _uuid_last_ms, _uuid_counter
    with _uuid_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _uuid_last_ms:
            _uuid_counter += 1
            if _uuid_counter > 0xFFF:
                _uuid_last_ms += 1
                _uuid_counter = 0
            ms = _uuid_last_ms
        else:
            _uuid_last_ms = ms
            _uuid_counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        counter = _uuid_counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_UUID7_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def is_job_id(value: str) -> bool:
    """Whether ``value`` is a lower-case UUIDv7 as svc takes for a job id."""
    return bool(_UUID7_RE.match(value))


def dumps(value: Any) -> bytes:
    """Compact JSON as svc expects it (no NaN or infinities)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
