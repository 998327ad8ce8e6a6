"""The parts of :mod:`rabbitry.shovel`: endpoint parsing and the ledger of moved messages."""
