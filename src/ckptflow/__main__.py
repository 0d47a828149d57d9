"""``python -m ckptflow`` is the same program as the ``ckptflow`` console script."""

import sys

from .cli import main

sys.exit(main())
