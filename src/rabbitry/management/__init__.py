"""A client of RabbitMQ's management HTTP API (the ``rabbitmq_management`` plugin).

Usage::

    from rabbitry.management import ManagementClient

    with ManagementClient("http://127.0.0.1:15672", "guest", "guest") as api:
        api.set_policy("ttl", "^orders\\.", {"message-ttl": 60000}, apply_to="queues")
        depth = api.queue("orders.billing").messages

:class:`AsyncManagementClient` has the same methods for asyncio. Both need the
``management`` extra (httpx): ``pip install 'rabbitry[management]'``. Importing this
package works without it; creating a client raises :class:`MissingExtraError` (an
``ImportError``) naming the extra. Policies are :class:`rabbitry.topology.Policy`
objects, validated with the same rules as queue arguments.
"""

from ._async_client import AsyncManagementClient
from ._client import ManagementClient
from ._ops import QueueInfo
from ._transport import MissingExtraError

__all__ = ["AsyncManagementClient", "ManagementClient", "MissingExtraError", "QueueInfo"]
