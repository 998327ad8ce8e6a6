"""Auto-registration of format ``rabbitmq`` for PySpark (4.0+).

Spark looks for top-level modules named ``pyspark_*`` that expose ``DefaultSource`` and
registers them, so ``spark.read.format("rabbitmq")`` works wherever rabbitry is installed
with its ``spark`` extra.
"""

from rabbitry.spark import RabbitMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
