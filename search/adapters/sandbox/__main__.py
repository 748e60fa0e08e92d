"""``python -m search.adapters.sandbox``: the child side (``child.main``), started by
``run_program``."""

import sys

from search.adapters.sandbox.child import main

if __name__ == "__main__":
    sys.exit(main())
