"""``python -m qkv.cli ...``: the qkv command."""

import sys

from . import main

sys.exit(main())
