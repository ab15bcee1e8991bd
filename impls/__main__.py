"""`python -m impls ...`: see impls/cli.py."""

import sys

from impls.cli import main

sys.exit(main())
