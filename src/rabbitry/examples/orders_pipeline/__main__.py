"""``python -m rabbitry.examples.orders_pipeline``: what ``make demo`` runs."""

import sys

from . import main

sys.exit(main())
