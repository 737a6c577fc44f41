"""``python -m coursekit doctor`` / ``python -m coursekit grade PATH``."""

import sys

from .cli import main

sys.exit(main())
