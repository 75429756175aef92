"""An env's virtual clock (``urn:agentenv:clock/v1``), as agent-env's gateway keeps one.

Reads compute ``t0 + real_elapsed * rate``, so virtual time moves on its own and reading it
never changes it; rate 0 is a frozen clock. Unarmed, the env answers wall time to its tools
and ``GET /clock/time`` is a 404, as upstream's.
"""

from __future__ import annotations

import math
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

MAX_RATE = 86400.0  # 1 real second = 1 virtual day
_MAX_T0 = datetime.max.replace(tzinfo=timezone.utc)
_OVERFLOW_HORIZON_S = 86400.0
# fromisoformat is looser than RFC3339, so the grammar is checked first (seconds and offset required).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")
_RFC3339_SHAPE = "YYYY-MM-DDThh:mm:ss[.fff](Z|+hh:mm)"
_DURATION = re.compile(r"^P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


class ClockError(ValueError):
    """An invalid clock setting (answered as HTTP 400) or a read of an unarmed clock."""


def parse_rfc3339(text: Any, field: str = "virtual_time") -> datetime:
    if not isinstance(text, str):
        raise ClockError(f"{field} must be an RFC3339 string, got {type(text).__name__}")
    if not _RFC3339.match(text):
        raise ClockError(f"invalid RFC3339 {field} {text!r}: expected {_RFC3339_SHAPE}")
    raw = text[:-1] + "+00:00" if text[-1] in "Zz" else text
    try:
        return datetime.fromisoformat(raw).astimezone(timezone.utc)
    except (ValueError, OverflowError) as exc:
        raise ClockError(f"invalid RFC3339 {field} {text!r}: {exc}") from None


def parse_duration(text: Any) -> timedelta:
    """An ISO-8601 duration of weeks, days, hours, minutes, seconds (``PT30M``, ``P1DT6H``)."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None or not any(match.groups()):
        raise ClockError(f"invalid ISO-8601 duration {text!r}: expected e.g. 'PT24H', 'P1DT6H', 'PT30M'")
    weeks, days, hours, minutes, seconds = (float(g or 0) for g in match.groups())
    return timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes, seconds=seconds)


def iso(moment: datetime) -> str:
    """``2026-11-30T09:00:00Z``: second precision, so tools, data and ``/clock/time`` agree."""
    return moment.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _parse_rate(rate: Any) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ClockError(f"virtual_seconds_per_real_second must be a number, got {type(rate).__name__}")
    if not math.isfinite(rate) or rate < 0:
        raise ClockError(f"virtual_seconds_per_real_second must be a finite number >= 0, got {rate}")
    if rate > MAX_RATE:
        raise ClockError(f"virtual_seconds_per_real_second {rate:g} exceeds max {MAX_RATE:g} "
                         "(1 real s = 1 virtual day)")
    return float(rate)


class VirtualClock:
    """Monotonic and thread-safe; ``now_fn`` (real seconds) is injectable for tests."""

    def __init__(self, now_fn: Callable[[], float] = time.monotonic) -> None:
        self._now = now_fn
        self._lock = threading.Lock()
        self._t0: datetime | None = None
        self._anchor = 0.0
        self._rate = 1.0
        self.generation = 0  # bumped on every arm/clear, so time triggers re-anchor

    @property
    def armed(self) -> bool:
        return self._t0 is not None

    def t0(self) -> datetime | None:
        return self._t0

    def set_time(self, virtual_time: Any, rate: Any = 1.0) -> dict[str, Any]:
        """Arm (or re-arm): ``virtual_time`` is now, advancing ``rate`` virtual s per real s."""
        t0 = parse_rfc3339(virtual_time)
        r = _parse_rate(1.0 if rate is None else rate)
        if t0 > _MAX_T0 - timedelta(seconds=_OVERFLOW_HORIZON_S * r):
            raise ClockError(f"virtual_time {virtual_time!r} at rate {r:g} would overflow near the max date")
        with self._lock:
            self._t0, self._anchor, self._rate = t0, self._now(), r
            self.generation += 1
        return self.state()

    def clear(self) -> dict[str, Any]:
        with self._lock:
            self._t0, self._rate = None, 1.0
            self.generation += 1
        return {"ok": True, "armed": False}

    def now(self) -> datetime | None:
        """The virtual now, or None while unarmed."""
        with self._lock:
            if self._t0 is None:
                return None
            try:
                return self._t0 + timedelta(seconds=(self._now() - self._anchor) * self._rate)
            except OverflowError:
                return _MAX_T0

    def read(self) -> dict[str, str]:
        """The consumer contract of ``GET /clock/time``: ``{"virtual_time": "<RFC3339>"}``."""
        current = self.now()
        if current is None:
            raise ClockError("clock is not armed")
        return {"virtual_time": iso(current)}

    def state(self) -> dict[str, Any]:
        current = self.now()
        if current is None:
            return {"armed": False}
        return {"armed": True, "t0": iso(self._t0), "virtual_seconds_per_real_second": self._rate,
                "virtual_time": iso(current)}
