"""`python -m moemeter.cli`, as `python -m moemeter`."""

import sys

from . import main

sys.exit(main())
