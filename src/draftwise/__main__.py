"""`python -m draftwise`: the `draftwise` command."""

import sys

from .cli import main

sys.exit(main())
