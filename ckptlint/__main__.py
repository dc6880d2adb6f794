"""``python -m ckptlint``."""

import sys

from ckptlint.cli import main

sys.exit(main())
