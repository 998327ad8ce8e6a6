"""The publishing interface between the engine's channels and the code that publishes.

See :mod:`rabbitry.publishing.pipe`: :class:`WritePath` (one per connection) and
:class:`PublishPipe` (one per channel). For the library's own publishing code (the
channels' ``basic_publish``, the publishers, the channel pool); not for applications.
"""

from __future__ import annotations

from .pipe import PublishPipe, Settleable, WritePath

__all__ = ["PublishPipe", "Settleable", "WritePath"]
