"""The checks of a consumer's constructor arguments (:class:`rabbitry.consumer.AsyncConsumer`
and its thread-safe twin): a wrong one fails at construction, not at ``start()``."""

from __future__ import annotations

from typing import Any

from ..exceptions import ConfigurationError

__all__ = ["check_options"]


def check_options(
    handler: Any,
    *,
    ack: str,
    prefetch: int,
    concurrency: int,
    retry: object,
    batch_size: int | None,
    batch_timeout: float | None,
) -> None:
    """Check a consumer's arguments (the ones named like the consumer's).

    Args:
        handler: the handler (must be callable).
        ack: ``"manual"`` or ``"auto"``.
        prefetch: 0..65535.
        concurrency: 1..65535.
        retry: a ``RetryPolicy`` or ``None``.
        batch_size: ``None`` or 1..65535.
        batch_timeout: ``None`` or > 0.

    Raises:
        ConfigurationError: one of them is wrong (the message says which, and why).
    """
    if ack not in ("manual", "auto"):
        raise ConfigurationError(f"ack: must be 'manual' or 'auto', got {ack!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigurationError(f"concurrency: must be an integer >= 1, got {concurrency!r}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 0 <= prefetch <= 65535:
        raise ConfigurationError(f"prefetch: must be an integer in 0..65535, got {prefetch!r}")
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ConfigurationError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
    if batch_timeout is not None and batch_timeout <= 0:
        raise ConfigurationError(f"batch_timeout: must be > 0 seconds, got {batch_timeout!r}")
    if not callable(handler):
        raise ConfigurationError(
            f"handler: must be callable (a function taking the message), got "
            f"{type(handler).__name__}"
        )
    _check_retry(retry)
    for field, value in (("concurrency", concurrency), ("batch_size", batch_size or 1)):
        if value > 65535:
            raise ConfigurationError(
                f"{field}: must be at most 65535, got {value} (prefetch is raised to it "
                "and basic.qos prefetch_count is a 16-bit field)"
            )


def _check_retry(retry: object) -> None:
    from ..topology._retry import RetryPolicy

    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(
            f"retry: must be a rabbitry.topology.RetryPolicy or None, got {type(retry).__name__}"
        )
