"""``python -m blisjax.cli``: the ``blisjax`` command."""

import sys

from blisjax.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
