"""The collaborators of :class:`rabbitry.consumer.AsyncConsumer` and its sync twin."""
