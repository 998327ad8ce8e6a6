"""Topology: a validated set of exchanges, queues and bindings, and its operations.

The operations live in their own modules (imported when used): ``_definitions`` (load
and save), ``_diff``, ``_on_broker`` (apply/verify/delete through either kind of
connection, on top of the engine side in ``_apply``) and ``_retry_build`` (the
entities ``with_retry`` adds).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from ._base import TopologyData
from ._model import Queue
from ._sharding import sharded_exchanges, sharding_policy

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from ..aio.connection import AsyncConnection
    from ..management import AsyncManagementClient, ManagementClient
    from ..sync.connection import Connection
    from ._apply import ApplyResult, VerifyReport
    from ._diff import PolicyOverlap
    from ._policy import Policy
    from ._retry import RetryPolicy

__all__ = ["Topology"]


class Topology(TopologyData):
    """A set of exchanges, queues, bindings and policies, applied in that order.

    Build it directly, load it (:meth:`from_dict`, :meth:`load`, :meth:`from_definitions`)
    and combine topologies with ``+``. An entity given twice identically is kept once;
    the same name with different settings is an error.

    Args:
        exchanges: the exchanges, declared first, in order.
        queues: the queues, declared next, in order.
        bindings: the bindings, declared next, in order.
        policies: the :class:`Policy` objects, set last through the management API
            (AMQP cannot set policies): ``apply`` then needs a management client.

    Raises:
        TopologyValidationError: an entity is invalid, a name is defined twice with
            different settings, or a binding refers to a server-named queue that is
            not part of the topology.
    """

    def effective_policy(self, queue: Queue | str) -> Policy | None:
        """The policy of this topology that RabbitMQ would apply to ``queue``.

        Args:
            queue: the queue, or its name.

        Returns:
            The highest-priority matching policy (on a tie the first one given here; the
            broker's choice between equal priorities is not documented), or ``None``.
        """
        from ._diff import effective_policy

        q = queue if isinstance(queue, Queue) else (self.queue(queue) or Queue(queue))
        return effective_policy(q, self.policies)

    def policy_overlaps(
        self, other: Topology | Mapping[str, Any] | None = None, *, vhost: str = "/"
    ) -> list[PolicyOverlap]:
        """Every key that both a queue argument and the policy in force set.

        Args:
            other: what else exists (another topology, or the broker's definitions
                export): its policies count too, unless this topology has one of the
                same name.
            vhost: the vhost to read from a definitions export.

        Returns:
            One :class:`PolicyOverlap` per key, with the value that applies (RabbitMQ's
            rule per key; see :mod:`rabbitry.topology`).
        """
        from ._definitions import from_definitions
        from ._diff import policy_overlaps

        policies = list(self.policies)
        if other is not None:
            theirs = (
                other if isinstance(other, Topology) else from_definitions(Topology, other, vhost)
            )
            policies += [p for p in theirs.policies if self.policy(p.name) is None]
        return [o for q in self.queues if q.name for o in policy_overlaps(q, policies)]

    # ------------------------------------------------------------------ documents

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Build from our own form: ``{"exchanges": [...], "queues": [...], "bindings": [...]}``.

        Args:
            data: the document, with the constructors' keyword names.

        Returns:
            The topology.

        Raises:
            TopologyValidationError: an unknown key or an invalid entity.
        """
        from ._definitions import from_dict

        return from_dict(Topology, data)

    @classmethod
    def from_definitions(cls, data: Mapping[str, Any], vhost: str = "/") -> Topology:
        """Build from a RabbitMQ definitions export.

        Args:
            data: the export (``rabbitmqctl export_definitions``, management
                ``/api/definitions``).
            vhost: the vhost whose entities are taken.

        Returns:
            The topology.

        Raises:
            TopologyValidationError: an invalid entity.
        """
        from ._definitions import from_definitions

        return from_definitions(Topology, data, vhost)

    @classmethod
    def from_json(cls, text: str, vhost: str = "/") -> Topology:
        """Parse JSON in our form or a definitions export.

        Args:
            text: the JSON text.
            vhost: the vhost whose entities a definitions export gives.

        Returns:
            The topology.

        Raises:
            TopologyValidationError: invalid JSON or an invalid entity.
        """
        from ._definitions import from_data, parse_text

        return from_data(Topology, parse_text(text, "json"), vhost)

    @classmethod
    def from_yaml(cls, text: str, vhost: str = "/") -> Topology:
        """Parse YAML (needs PyYAML: ``rabbitry[yaml]``); same shapes as :meth:`from_json`.

        Args:
            text: the YAML text.
            vhost: the vhost whose entities a definitions export gives.

        Returns:
            The topology.

        Raises:
            TopologyValidationError: invalid YAML or an invalid entity.
            ImportError: PyYAML is not installed.
        """
        from ._definitions import from_data, parse_text

        return from_data(Topology, parse_text(text, "yaml"), vhost)

    @classmethod
    def load(cls, path: str | os.PathLike[str], vhost: str = "/") -> Topology:
        """Read a ``.json``, ``.yaml`` or ``.yml`` file (our form or a definitions export).

        Args:
            path: the file.
            vhost: the vhost whose entities a definitions export gives.

        Returns:
            The topology.

        Raises:
            TopologyValidationError: unknown suffix, invalid document or invalid entities.
            OSError: the file cannot be read.
        """
        from ._definitions import load

        return load(Topology, path, vhost)

    def to_dict(self) -> dict[str, Any]:
        """Our own form, with only the fields that differ from their defaults."""
        from ._definitions import to_dict

        return to_dict(self)

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text.

        Args:
            indent: ``json.dumps``'s indent (``None``: one line).

        Returns:
            The JSON text.
        """
        return json.dumps(self.to_dict(), indent=indent)

    def to_yaml(self) -> str:
        """:meth:`to_dict` as YAML text (needs PyYAML)."""
        from ._definitions import dump_yaml

        return dump_yaml(self.to_dict())

    def to_definitions(self, vhost: str = "/") -> dict[str, Any]:
        """A definitions document for ``rabbitmqctl import_definitions``.

        Exclusive and server-named queues are left out, as RabbitMQ's own export does.

        Args:
            vhost: the vhost the entities are given.

        Returns:
            The document.
        """
        from ._definitions import to_definitions

        return to_definitions(self, vhost)

    # ------------------------------------------------------------------ composition

    def with_retry(
        self, queue: str, policy: RetryPolicy, *, delivery_limit: int | None = None
    ) -> Topology:
        """A new topology that also holds the retry machinery for ``queue``.

        Adds ``<queue>.dlx``, one ``<queue>.retry.<delay>`` queue per distinct delay,
        ``<queue>.parking-lot`` (if the policy has one) and their bindings, and makes
        ``queue`` dead-letter to ``<queue>.dlx``. Give the consumer the same policy.
        See :mod:`rabbitry.topology` for the design.

        A quorum ``queue`` gets an explicit delivery limit: the queue's own, else
        ``delivery_limit``, else 20 (RabbitMQ 4.0's default, also applied on 3.x); its
        retry queues and parking lot get one that is never reached, and its policy must
        republish (``RetryPolicy(..., republish=True)`` with one delay), so that a
        message returned too often is parked, never dropped.

        Args:
            queue: the work queue (already in this topology).
            policy: the retry policy.
            delivery_limit: a quorum work queue's delivery limit when it has none;
                ``-1`` is unlimited (RabbitMQ 4.0+ only).

        Returns:
            The new topology (this one is unchanged).

        Raises:
            TopologyValidationError: ``queue`` is not in this topology, is a stream,
                already dead-letters somewhere else, or is a quorum queue with a
                broker-driven policy.
        """
        from ._retry_build import build_retry

        return build_retry(Topology, self, queue, policy, delivery_limit=delivery_limit)

    def with_sharding(
        self,
        exchange: str,
        shards_per_node: int,
        *,
        routing_key: str | None = None,
        priority: int = 0,
    ) -> Topology:
        """A new topology that also holds a ``rabbitmq_sharding`` policy for ``exchange``.

        The policy (``<exchange>.sharding``, matching that name only, applied to
        exchanges) makes the plugin declare ``shards_per_node`` queues on every node,
        ``sharding: <exchange> - <node> - <n>``, and bind them to the exchange; consume
        from the exchange's name (:class:`rabbitry.sharded_queue.ShardedQueueConsumer`).
        Give the exchange the plugin's type, :data:`MODULUS_HASH`, so that each message
        goes to one shard. Policies are set through the management API: ``apply`` then
        needs ``management=``.

        Args:
            exchange: the exchange (already in this topology).
            shards_per_node: queues per node, at least 1.
            routing_key: the key the shards are bound with (``x-modulus-hash`` and
                ``fanout`` ignore it; a ``direct`` exchange then routes only that key).
            priority: the policy's priority.

        Returns:
            The new topology (this one is unchanged).

        Raises:
            TopologyValidationError: ``exchange`` is not in this topology, a value breaks
                a rule, or a queue of this topology has the exchange's name.
        """
        policy = sharding_policy(self.exchanges, exchange, shards_per_node, routing_key, priority)
        return self + Topology(policies=[policy])

    def sharded_exchanges(self) -> dict[str, int]:
        """``{exchange: shards-per-node}`` for the exchanges this topology's policies shard."""
        return sharded_exchanges(self.exchanges, self.policies)

    def diff(
        self,
        other: Topology | Mapping[str, Any],
        *,
        vhost: str = "/",
        extra: bool = True,
        default_queue_type: str | None = None,
    ) -> list[str]:
        """Readable differences between this topology and ``other``.

        Args:
            other: another topology, or a definitions export (what the broker has).
            vhost: the vhost to read from a definitions export.
            extra: also list what only ``other`` has (``... : not in ours``); pass
                ``False`` against a whole broker's export.
            default_queue_type: the vhost's default queue type, which a queue without
                ``queue_type`` gets (if durable, not exclusive, not auto-delete); by
                default read from a definitions export, else ``classic``.

        Returns:
            One line per difference, e.g. ``queue 'jobs': x-message-ttl: ours 1000,
            theirs 2000``; empty when ``other`` matches.
        """
        from ._definitions import from_definitions
        from ._diff import default_queue_type as vhost_default
        from ._diff import diff_topologies

        theirs = other if isinstance(other, Topology) else from_definitions(Topology, other, vhost)
        if default_queue_type is None:
            default_queue_type = (
                "classic" if isinstance(other, Topology) else vhost_default(other, vhost)
            )
        return diff_topologies(self, theirs, extra=extra, default_queue_type=default_queue_type)

    # ------------------------------------------------------------------ the broker

    async def aapply(
        self,
        connection: AsyncConnection,
        *,
        timeout: float | None = None,
        management: AsyncManagementClient | None = None,
        missing_exchanges: Literal["error", "warn"] = "error",
    ) -> ApplyResult[Topology]:
        """Declare everything on an :class:`~rabbitry.AsyncConnection`, idempotently.

        Policies first (through ``management``: AMQP cannot set them), then exchanges,
        queues and bindings on a channel of its own (opened and closed here). Each
        declared entity is added to ``connection.topology_record`` for recovery. A
        server-named queue's assigned name is used by the bindings that refer to its
        ``Queue`` object and reported in the result.

        Args:
            connection: an open connection.
            timeout: seconds per declaration.
            management: an :class:`~rabbitry.management.AsyncManagementClient` for the
                same broker; required when the topology has policies, which are set in
                the connection's vhost.
            missing_exchanges: what to do when an ``alternate_exchange`` or
                ``dead_letter_exchange`` (of an exchange, a queue or a policy) is neither
                in the topology nor on the broker, which would make the broker drop the
                messages sent there: ``"error"`` (default) raises
                :class:`~rabbitry.TopologyMissingExchange` before anything is declared;
                ``"warn"`` logs it at ERROR and goes on.

        Returns:
            What was declared (:class:`ApplyResult`).

        Raises:
            TopologyMissingExchange: a dangling alternate / dead-letter exchange (checked
                with passive declares before anything is declared).
            TopologyError: the topology has policies and no ``management`` was given
                (raised before anything is sent).
            ManagementError: the management API refused a policy.
            TopologyConflict: an entity exists with other arguments (406); the
                connection stays usable.
            ChannelClosedByBroker: another refusal (e.g. 404 binding to a missing
                exchange, 403); a note names the entity.
        """
        from ._on_broker import aapply

        return await aapply(
            self,
            connection,
            timeout=timeout,
            management=management,
            missing_exchanges=missing_exchanges,
        )

    def apply(
        self,
        connection: Connection,
        *,
        timeout: float | None = None,
        management: ManagementClient | None = None,
        missing_exchanges: Literal["error", "warn"] = "error",
    ) -> ApplyResult[Topology]:
        """:meth:`aapply` for a thread-safe :class:`~rabbitry.Connection` (blocks).

        Args:
            connection: an open connection.
            timeout: seconds per declaration.
            management: a :class:`~rabbitry.management.ManagementClient` for the same
                broker; required when the topology has policies.
            missing_exchanges: ``"error"`` or ``"warn"``, as for :meth:`aapply`.

        Returns:
            What was declared (:class:`ApplyResult`).

        Raises:
            TopologyMissingExchange: as :meth:`aapply`.
            TopologyError: as :meth:`aapply`.
            ManagementError: as :meth:`aapply`.
            TopologyConflict: as :meth:`aapply`.
            ChannelClosedByBroker: as :meth:`aapply`.
        """
        from ._on_broker import apply

        return apply(
            self,
            connection,
            timeout=timeout,
            management=management,
            missing_exchanges=missing_exchanges,
        )

    async def averify(
        self,
        connection: AsyncConnection,
        *,
        timeout: float | None = None,
        management: AsyncManagementClient | None = None,
        missing_exchanges: Literal["error", "warn"] = "error",
    ) -> VerifyReport:
        """Check with passive declares which exchanges and queues exist.

        Bindings cannot be checked over AMQP (there is no passive bind) and arguments
        are not returned by a passive declare: compare a definitions export with
        :meth:`diff` for those. Policies are checked through ``management`` (missing
        or different); without it they are reported as unchecked.

        Every ``alternate_exchange`` and ``dead_letter_exchange`` the topology names
        must be in it or on the broker: with ``missing_exchanges="error"`` (default) a
        dangling one raises :class:`~rabbitry.TopologyMissingExchange`; with
        ``"warn"`` it is logged at ERROR and listed in the report's ``dangling``.

        Args:
            connection: an open connection.
            timeout: seconds per passive declare.
            management: an :class:`~rabbitry.management.AsyncManagementClient` to check
                the policies with (``None``: they are reported as unchecked).
            missing_exchanges: ``"error"`` or ``"warn"`` (above).

        Returns:
            What exists and what is missing (:class:`VerifyReport`).
        """
        from ._on_broker import averify

        return await averify(
            self,
            connection,
            timeout=timeout,
            management=management,
            missing_exchanges=missing_exchanges,
        )

    def verify(
        self,
        connection: Connection,
        *,
        timeout: float | None = None,
        management: ManagementClient | None = None,
        missing_exchanges: Literal["error", "warn"] = "error",
    ) -> VerifyReport:
        """:meth:`averify` for a thread-safe :class:`~rabbitry.Connection` (blocks).

        Args:
            connection: an open connection.
            timeout: seconds per passive declare.
            management: a :class:`~rabbitry.management.ManagementClient` to check the
                policies with (``None``: they are reported as unchecked).
            missing_exchanges: ``"error"`` or ``"warn"``, as for :meth:`averify`.

        Returns:
            What exists and what is missing (:class:`VerifyReport`).
        """
        from ._on_broker import verify

        return verify(
            self,
            connection,
            timeout=timeout,
            management=management,
            missing_exchanges=missing_exchanges,
        )

    async def adelete(
        self,
        connection: AsyncConnection,
        *,
        timeout: float | None = None,
        management: AsyncManagementClient | None = None,
    ) -> None:
        """Delete this topology's bindings, queues, exchanges and policies; forget them.

        They are removed from ``connection.topology_record`` so recovery does not declare
        them again. What is already gone is skipped. Server-named queues are skipped
        unless this is ``ApplyResult.topology`` (which carries their names). Policies
        need ``management`` (checked before anything is deleted).

        Args:
            connection: an open connection.
            timeout: seconds per deletion.
            management: an :class:`~rabbitry.management.AsyncManagementClient`; needed
                when the topology has policies.
        """
        from ._on_broker import adelete

        await adelete(self, connection, timeout=timeout, management=management)

    def delete(
        self,
        connection: Connection,
        *,
        timeout: float | None = None,
        management: ManagementClient | None = None,
    ) -> None:
        """:meth:`adelete` for a thread-safe :class:`~rabbitry.Connection` (blocks).

        Args:
            connection: an open connection.
            timeout: seconds per deletion.
            management: a :class:`~rabbitry.management.ManagementClient`; needed when the
                topology has policies.
        """
        from ._on_broker import delete

        delete(self, connection, timeout=timeout, management=management)
