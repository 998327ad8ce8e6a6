"""``python -m rabbitry``: the ``rabbitry`` command line (needs ``rabbitry[cli]``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
