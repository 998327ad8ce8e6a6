"""Messages as they come out of the broker, and their properties."""

from .protocol.message import Message, Properties, Settled

__all__ = ["Message", "Properties", "Settled"]
