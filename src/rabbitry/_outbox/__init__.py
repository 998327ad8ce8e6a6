"""The parts of the durable outbox (:mod:`rabbitry.outbox`) and its publisher
(:mod:`rabbitry.outbox_publisher`)."""
