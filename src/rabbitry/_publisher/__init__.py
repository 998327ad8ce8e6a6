"""The machinery of :class:`rabbitry.publisher.AsyncPublisher`: its core and its port."""
