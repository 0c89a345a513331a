"""The one place retry policies live: bounded, transient errors only, never around a mutating apply."""

from __future__ import annotations

import asyncio
import errno

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)
from tunnelspec.core.errors import HostKeyError, TaskFailed

_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}


def _is_transient_connect_error(exc: BaseException) -> bool:
    if isinstance(exc, HostKeyError):
        return False  # a key problem never fixes itself
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    import asyncssh  # lazy: asyncssh (start-up cost), needed only once an error is judged

    return isinstance(exc, (asyncssh.ConnectionLost,))


def connect_retrying(attempts: int = 3, max_delay: float = 20.0) -> AsyncRetrying:
    """Policy for opening SSH connections (read-only by nature)."""
    return AsyncRetrying(
        stop=stop_after_attempt(attempts) | stop_after_delay(max_delay),
        wait=wait_exponential(multiplier=0.5, max=4),
        retry=retry_if_exception(_is_transient_connect_error),
        reraise=True,
    )


def poll_retrying(deadline: float, interval: float = 0.5) -> AsyncRetrying:
    """Policy for read-only readiness probes (a service coming up, a tunnel answering)."""
    return AsyncRetrying(
        stop=stop_after_delay(deadline),
        wait=wait_fixed(interval),
        retry=retry_if_exception_type(TaskFailed),
        reraise=True,
    )
