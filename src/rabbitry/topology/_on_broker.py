"""A topology on a broker: apply, verify and delete it through either kind of connection.

Each operation first checks what it was given (the connection's kind, a management
client when the topology has policies, the broker's version), then runs the engine
side (:mod:`._apply`) on the connection, directly for an
:class:`~rabbitry.AsyncConnection` or through the portal of a thread-safe
:class:`~rabbitry.Connection`, and sets, reads or deletes the policies through the
management API. ``Topology``'s methods of the same names call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..exceptions import ManagementNotFound, TopologyError, TopologyValidationError
from ._apply import check_policies, verify_topology

if TYPE_CHECKING:
    from ..aio.connection import AsyncConnection
    from ..management import AsyncManagementClient, ManagementClient
    from ..sync._portal import Portal
    from ..sync.connection import Connection
    from ._apply import ApplyResult, VerifyReport
    from ._base import T, TopologyData

__all__ = ["aapply", "adelete", "apply", "averify", "delete", "verify"]

#: What ``missing_exchanges=`` accepts.
MissingExchanges = Literal["error", "warn"]


async def aapply(
    topology: T,
    connection: AsyncConnection,
    *,
    timeout: float | None,
    management: AsyncManagementClient | None,
    missing_exchanges: MissingExchanges,
) -> ApplyResult[T]:
    """Set the policies, then declare the rest on an async connection (``Topology.aapply``)."""
    from ._apply import apply_topology

    _require_async(connection, "aapply", "apply")
    _require_management(topology, management, "apply")
    _check_for_broker(topology, connection.server_version)
    if management is not None:
        _require_management_kind(management, "AsyncManagementClient", "aapply")
        for policy in topology.policies:
            await management.put_policy(policy, connection.params.virtual_host)
    return await apply_topology(
        topology, connection, timeout=timeout, missing_exchanges=missing_exchanges
    )


def apply(
    topology: T,
    connection: Connection,
    *,
    timeout: float | None,
    management: ManagementClient | None,
    missing_exchanges: MissingExchanges,
) -> ApplyResult[T]:
    """:func:`aapply` for a thread-safe connection (``Topology.apply``)."""
    from ._apply import apply_topology

    portal, engine = _require_sync(connection, "apply", "aapply")
    _require_management(topology, management, "apply")
    _check_for_broker(topology, connection.server_version)
    if management is not None:
        _require_management_kind(management, "ManagementClient", "apply")
        for policy in topology.policies:
            management.put_policy(policy, connection.params.virtual_host)
    return portal.call(
        apply_topology,
        topology,
        engine,
        timeout=timeout,
        missing_exchanges=missing_exchanges,
    )


async def averify(
    topology: TopologyData,
    connection: AsyncConnection,
    *,
    timeout: float | None,
    management: AsyncManagementClient | None,
    missing_exchanges: MissingExchanges,
) -> VerifyReport:
    """Passive-declare, then check the policies if a client is given (``Topology.averify``)."""
    _require_async(connection, "averify", "verify")
    report = await verify_topology(
        topology, connection, timeout=timeout, missing_exchanges=missing_exchanges
    )
    if management is None or not topology.policies:
        return report
    _require_management_kind(management, "AsyncManagementClient", "averify")
    found = await management.policies(connection.params.virtual_host)
    return check_policies(topology, report, found)


def verify(
    topology: TopologyData,
    connection: Connection,
    *,
    timeout: float | None,
    management: ManagementClient | None,
    missing_exchanges: MissingExchanges,
) -> VerifyReport:
    """:func:`averify` for a thread-safe connection (``Topology.verify``)."""
    portal, engine = _require_sync(connection, "verify", "averify")
    report = portal.call(
        verify_topology,
        topology,
        engine,
        timeout=timeout,
        missing_exchanges=missing_exchanges,
    )
    if management is None or not topology.policies:
        return report
    _require_management_kind(management, "ManagementClient", "verify")
    found = management.policies(connection.params.virtual_host)
    return check_policies(topology, report, found)


async def adelete(
    topology: TopologyData,
    connection: AsyncConnection,
    *,
    timeout: float | None,
    management: AsyncManagementClient | None,
) -> None:
    """Delete the entities, then the policies (``Topology.adelete``)."""
    from ._apply import delete_topology

    _require_async(connection, "adelete", "delete")
    _require_management(topology, management, "delete")
    await delete_topology(topology, connection, timeout=timeout)
    if management is not None:
        _require_management_kind(management, "AsyncManagementClient", "adelete")
        for policy in topology.policies:
            try:
                await management.delete_policy(policy.name, connection.params.virtual_host)
            except ManagementNotFound:
                pass


def delete(
    topology: TopologyData,
    connection: Connection,
    *,
    timeout: float | None,
    management: ManagementClient | None,
) -> None:
    """:func:`adelete` for a thread-safe connection (``Topology.delete``)."""
    from ._apply import delete_topology

    portal, engine = _require_sync(connection, "delete", "adelete")
    _require_management(topology, management, "delete")
    portal.call(delete_topology, topology, engine, timeout=timeout)
    if management is not None:
        _require_management_kind(management, "ManagementClient", "delete")
        for policy in topology.policies:
            try:
                management.delete_policy(policy.name, connection.params.virtual_host)
            except ManagementNotFound:
                pass


def _check_for_broker(topology: TopologyData, version: tuple[int, ...]) -> None:
    """Refuse what means something else on this broker's version (before sending)."""
    if not version or version >= (4,):
        return
    shown = ".".join(map(str, version))
    rule = (
        f"-1 means unlimited only on RabbitMQ 4.0+; RabbitMQ {shown} dead-letters (or "
        "drops) a message at its first return with a negative limit. Leave it unset: 3.x "
        "quorum queues have no limit by default"
    )
    for queue in topology.queues:
        if queue.delivery_limit is not None and queue.delivery_limit < 0:
            raise TopologyValidationError(queue.label, "delivery_limit (x-delivery-limit)", rule)
    for policy in topology.policies:
        value = (policy.definition or {}).get("delivery-limit")
        if isinstance(value, int) and value < 0:
            raise TopologyValidationError(policy.label, "definition['delivery-limit']", rule)


def _require_management(topology: TopologyData, management: object, what: str) -> None:
    if topology.policies and management is None:
        names = ", ".join(repr(p.name) for p in topology.policies)
        raise TopologyError(
            f"this topology has {len(topology.policies)} policies ({names}), which only the "
            f"management HTTP API can {what} (AMQP cannot): pass "
            "management=ManagementClient(...) (or AsyncManagementClient for the async API)"
        )


def _require_management_kind(management: object, kind: str, name: str) -> None:
    from .. import management as api

    if not isinstance(management, getattr(api, kind)):
        raise TypeError(
            f"Topology.{name}(management=...) takes a rabbitry.management.{kind}, "
            f"got {type(management).__name__}"
        )


def _require_async(connection: object, name: str, twin: str) -> None:
    from ..sync._connection import Connection as SyncConnection

    if isinstance(connection, SyncConnection):
        raise TypeError(
            f"Topology.{name}() takes an AsyncConnection; use topology.{twin}(connection) "
            "with a rabbitry.Connection"
        )


def _require_sync(connection: object, name: str, twin: str) -> tuple[Portal, AsyncConnection]:
    """The portal and the engine of a thread-safe connection (else ``TypeError``)."""
    from ..sync._connection import Connection as SyncConnection
    from ..sync._connection import engine_of, portal_of

    if not isinstance(connection, SyncConnection):
        raise TypeError(
            f"Topology.{name}() takes a rabbitry.Connection; use await topology.{twin}"
            "(connection) with an AsyncConnection"
        )
    return portal_of(connection), engine_of(connection)
