"""``python -m orders_pipeline`` (``examples/`` on the path): what ``make demo`` runs."""

import sys

from . import main

sys.exit(main())
