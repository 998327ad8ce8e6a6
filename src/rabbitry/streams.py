"""Quorum and stream queues: client-side rules checked before ``basic.consume``.

The rules and their documentation are in :mod:`rabbitry.protocol.streams`; the names
are the same here.
"""

from .protocol.streams import STREAM_OFFSET, StreamOffset, check_consume, stream_offset_argument

__all__ = ["STREAM_OFFSET", "StreamOffset", "check_consume", "stream_offset_argument"]
