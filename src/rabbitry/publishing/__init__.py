"""The publishing interface between the engine's channels and the code that publishes.

See :mod:`rabbitry.publishing.pipe`: :class:`WritePath` (one per connection) and
:class:`PublishPipe` (one per channel). For the library's own publishing code (the
channels' ``basic_publish``, the publishers, the channel pool); not for applications.

The collaborators an asyncio publisher is composed of live here too:
:mod:`~rabbitry.publishing.encoding` (the message encoder),
:mod:`~rabbitry.publishing.window` (the send window),
:mod:`~rabbitry.publishing.records` (what the confirm table settles) and
:mod:`~rabbitry.publishing.confirms` (the book of sent, unsettled messages).
"""

from __future__ import annotations

from .pipe import PublishPipe, Settleable, WritePath

__all__ = ["PublishPipe", "Settleable", "WritePath"]
