"""Retries made visible: botocore retries a failed S3 request silently (``standard`` mode, up to
``max_attempts`` attempts); ``announce_retries`` makes the first retryable failure of a store one
WARNING line on stderr saying what is retried, against which endpoint, and for how long at most, so an
unreachable endpoint is not seconds of silence. Later retries of the same store log at INFO (``-v``).

The line is decided with botocore's own standard retry conditions, so it appears exactly when botocore
will retry; the handler returns None, which leaves botocore's retry decision and delay unchanged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from botocore.retries.standard import RetryEventAdapter, StandardRetryConditions

log = logging.getLogger(__name__)

# botocore's standard backoff: rand(0, 1) * min(scale * 2**i, 20) s before retry i+1, where the scale
# is 0.05 s for transient errors (connection refused, 5xx) and 1 s for throttling.
_MAX_BACKOFF, _TRANSIENT_SCALE, _THROTTLING_SCALE = 20.0, 0.05, 1.0


def longest_backoff(max_attempts: int) -> float:
    """The longest total wait botocore may add between ``max_attempts`` attempts of one request (throttled)."""
    return max_backoff(max_attempts, _THROTTLING_SCALE)


def max_backoff(max_attempts: int, scale: float) -> float:
    """The longest total wait between ``max_attempts`` attempts (botocore's jitter only shortens it)."""
    return sum(min(scale * 2**i, _MAX_BACKOFF) for i in range(max(max_attempts - 1, 0)))


def announce_retries(client: Any, endpoint: str, max_attempts: int) -> None:
    """Log the first retryable failure of ``client`` at WARNING, the others at INFO."""
    adapter, conditions = RetryEventAdapter(), StandardRetryConditions(max_attempts=max_attempts)
    announced = threading.Event()

    def on_needs_retry(**kwargs: Any) -> None:
        context = adapter.create_retry_context(**kwargs)
        if not conditions.is_retryable(context):
            return None
        op = kwargs["operation"].name
        exc = kwargs.get("caught_exception")
        why = f"{type(exc).__name__}: {exc}" if exc is not None else _status(kwargs.get("response"))
        attempt = kwargs["attempts"]
        if announced.is_set():
            log.info("%s %s attempt %d of %d failed (%s); retrying", endpoint, op, attempt, max_attempts, why)
            return None
        announced.set()
        log.warning("%s %s failed (%s); retrying up to %d more times with backoff (at most %.1f s of waiting, "
                    "%.0f s when throttled) before giving up", endpoint, op, why, max_attempts - attempt,
                    max_backoff(max_attempts - attempt + 1, _TRANSIENT_SCALE),
                    max_backoff(max_attempts - attempt + 1, _THROTTLING_SCALE))
        return None

    client.meta.events.register_last("needs-retry.s3", on_needs_retry)


def _status(response: Any) -> str:
    try:
        http, parsed = response
        code = parsed.get("Error", {}).get("Code")
        return f"HTTP {http.status_code}" + (f" {code}" if code else "")
    except (TypeError, ValueError, AttributeError):
        return "a retryable answer"
