"""``python -m rabbitry.cli``: the same as the ``rabbitry`` console script."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
