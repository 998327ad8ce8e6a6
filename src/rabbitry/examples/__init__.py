"""Runnable examples that ship with rabbitry (not part of the library API).

* :mod:`rabbitry.examples.orders_pipeline`: the reference pipeline behind ``make demo``
  (publish with confirms, route, consume with Spark, retry, park, write Parquet).
"""
