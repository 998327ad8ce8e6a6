"""Connection settings: the :class:`ConnectionParameters` value and AMQP URL parsing.

A connection is described by one immutable, fully validated
:class:`ConnectionParameters`. Build it directly, or from a URL with :func:`parse_url`
(one broker) or :func:`parse_urls` (several brokers, tried in order)::

    params = parse_url("amqps://app:s3cret@rabbit.example.com/orders?heartbeat=30")
    params = parse_url(default_url(), connection_name="billing-worker")

URLs follow the RabbitMQ URI specification (https://www.rabbitmq.com/docs/uri-spec) and
the query parameters of https://www.rabbitmq.com/docs/uri-query-parameters, with these
deliberate differences, each chosen so that a URL means what a Python user expects:

* **Virtual host of a bare "/" path.** The URI spec reads ``amqp://host/`` as the *empty*
  virtual host and only ``amqp://host/%2F`` as ``/``. In practice nobody has an empty
  vhost, and every Python client (pika, aio-pika, kombu) reads ``amqp://host/`` as
  RabbitMQ's default vhost ``/``; so do we. The empty vhost is therefore not reachable
  from a URL, and :class:`ConnectionParameters` refuses it too.
* **connection_timeout is in seconds** (a float) here, like every other duration in
  rabbitry. The RabbitMQ (Erlang client) page documents it in *milliseconds*; a URL
  copied from there with ``connection_timeout=10000`` would mean 10000 s here.
* **auth_mechanism takes one value.** The Erlang client accepts it repeatedly as a list
  of candidates; we negotiate exactly one mechanism, so a repeat is an error like any
  other duplicated parameter.
* **Everything unknown is an error**: unknown query parameters, fragments, TLS options
  on a plain ``amqp://`` URL. A silently ignored typo (``hearbeat=5``) costs more than a
  loud failure at start-up.

Errors are :class:`~rabbitry.exceptions.ConfigurationError` (a ``ValueError``) whose
message starts with the offending field or URL part and states the rule. Messages never
contain the password.
"""

from ._parameters import (
    AMQP_PORT,
    AMQPS_PORT,
    AUTH_MECHANISMS,
    DEFAULT_URL,
    FRAME_MIN_SIZE,
    ConnectionParameters,
)
from ._urls import default_url, parse_url, parse_urls

__all__ = [
    "AMQPS_PORT",
    "AMQP_PORT",
    "AUTH_MECHANISMS",
    "DEFAULT_URL",
    "FRAME_MIN_SIZE",
    "ConnectionParameters",
    "default_url",
    "parse_url",
    "parse_urls",
]
