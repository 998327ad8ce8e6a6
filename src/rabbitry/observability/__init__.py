"""OpenTelemetry traces and metrics for rabbitry, and a Prometheus endpoint (extra ``otel``).

Nothing is recorded until :func:`instrument` is called; until then the library's hot
paths cost one ``None`` check. ``opentelemetry`` is imported only here, when asked for,
so rabbitry works without the extra. See ``docs/observability.md`` for every span,
attribute and metric.

Usage::

    from rabbitry import observability

    observability.instrument()             # the global tracer and meter providers
    server = observability.serve_prometheus(9464)   # needs opentelemetry-sdk
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError
from . import _state

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from ._otel import Instrumentation
    from .prometheus import PrometheusReader, PrometheusServer

__all__ = [
    "PrometheusReader",
    "PrometheusServer",
    "instrument",
    "is_instrumented",
    "serve_prometheus",
    "uninstrument",
]

_lock = threading.Lock()

_MISSING = (
    "rabbitry.observability needs OpenTelemetry: pip install 'rabbitry[otel]' "
    "(opentelemetry-api; the Prometheus endpoint also needs opentelemetry-sdk)"
)


def instrument(
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    *,
    consumer_lag_interval: float | None = None,
) -> None:
    """Record spans and metrics for every publisher, consumer and connection.

    Replaces a previous instrumentation. Consumers and connections created before the
    call are not followed (publishers are: each ``publish`` looks).

    Args:
        tracer_provider: where spans go; ``None`` uses the global provider
            (``opentelemetry.trace.set_tracer_provider``), also when it is set later.
        meter_provider: where metrics go; ``None`` uses the global provider.
        consumer_lag_interval: export the depth of every consumed queue
            (``rabbitry.queue.messages``), polled with a passive ``queue.declare`` every
            this many seconds on a channel of the consumer's connection; ``None`` (the
            default) polls nothing.

    Raises:
        ConfigurationError: OpenTelemetry is not installed, or
            ``consumer_lag_interval`` is not a positive number.
    """
    if consumer_lag_interval is not None and (
        isinstance(consumer_lag_interval, bool)
        or not isinstance(consumer_lag_interval, int | float)
        or not consumer_lag_interval > 0
    ):
        raise ConfigurationError(
            f"consumer_lag_interval: must be a positive number of seconds or None, "
            f"got {consumer_lag_interval!r}"
        )
    try:
        from ._otel import Instrumentation
    except ImportError as exc:
        raise ConfigurationError(_MISSING) from exc
    with _lock:
        previous = _state.active
        _state.active = Instrumentation(
            tracer_provider, meter_provider, consumer_lag_interval=consumer_lag_interval
        )
    if previous is not None:
        _close(previous)


def uninstrument() -> None:
    """Stop recording: the hot paths are back to one ``None`` check. Idempotent."""
    with _lock:
        previous, _state.active = _state.active, None
    if previous is not None:
        _close(previous)


def is_instrumented() -> bool:
    """:func:`instrument` was called (and not undone)."""
    return _state.active is not None


def current_instrumentation() -> Instrumentation | None:
    """The installed instrumentation (for the library's own use).

    Returns:
        The instrumentation :func:`instrument` installed (its providers and options),
        or ``None``.
    """
    active = _state.active
    if active is None:
        return None
    from ._otel import Instrumentation

    assert isinstance(active, Instrumentation)
    return active


def _close(instrumentation: Any) -> None:
    instrumentation.close()


def serve_prometheus(
    port: int = 9464, *, host: str = "127.0.0.1", reader: PrometheusReader | None = None
) -> PrometheusServer:
    """Serve rabbitry's metrics in the Prometheus text format on ``http://host:port/metrics``.

    With ``reader=None`` it makes a :class:`PrometheusReader` and an SDK
    ``MeterProvider`` for it and instruments rabbitry with that provider (keeping the
    tracer provider and options of a current instrumentation). Pass the reader you gave
    your own ``MeterProvider`` to serve that instead.

    Args:
        port: the TCP port; 0 picks a free one (see ``server.port``).
        host: the address to listen on (default: loopback only).
        reader: a reader already attached to a meter provider.

    Returns:
        The running server (a daemon thread); ``close()`` stops it.

    Raises:
        ConfigurationError: opentelemetry-sdk is not installed.
        OSError: the port is taken.
    """
    try:
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider

        from .prometheus import PrometheusReader, PrometheusServer
    except ImportError as exc:
        raise ConfigurationError(_MISSING) from exc
    if reader is None:
        reader = PrometheusReader()
        active = current_instrumentation()
        instrument(
            active.tracer_provider if active is not None else None,
            SdkMeterProvider(metric_readers=[reader]),
            consumer_lag_interval=active.consumer_lag_interval if active is not None else None,
        )
    current = current_instrumentation()
    if current is not None and reader.zero_source is None:
        reader.zero_source = current.metrics.zero_series
    return PrometheusServer(reader, host=host, port=port)


def __getattr__(name: str) -> Any:
    if name in ("PrometheusReader", "PrometheusServer"):
        try:
            from . import prometheus
        except ImportError as exc:
            raise ConfigurationError(_MISSING) from exc
        return getattr(prometheus, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
