"""Heartbeat accounting (§4.2.7): how long each direction of a connection has been silent.

The protocol has no clock: traffic only raises :attr:`HeartbeatClock.rx_seen` and
:attr:`HeartbeatClock.tx_seen` (attribute stores, nothing called per frame), and each
tick turns those flags into times.
"""

from __future__ import annotations


class HeartbeatClock:
    """Turns the traffic seen between two ticks into the silence of each direction."""

    __slots__ = ("_last_rx", "_last_tx", "rx_seen", "tx_seen")

    def __init__(self) -> None:
        #: Something arrived since the last tick.
        self.rx_seen = False
        #: Something was handed to the socket since the last tick.
        self.tx_seen = False
        self._last_rx: float | None = None
        self._last_tx: float | None = None

    def silence(self, now: float, rx_paused: bool) -> tuple[float, float]:
        """Record a tick and measure both directions' silence.

        Args:
            now: a monotonic time in seconds.
            rx_paused: the engine stopped reading on purpose: the silence is ours, so the
                incoming side counts as heard from now.

        Returns:
            ``(seconds since data arrived, seconds since data was sent)``, each measured
            from the first tick that saw no traffic that way.
        """
        if self.rx_seen or self._last_rx is None or rx_paused:
            self._last_rx = now
            self.rx_seen = False
        if self.tx_seen or self._last_tx is None:
            self._last_tx = now
            self.tx_seen = False
        return now - self._last_rx, now - self._last_tx
