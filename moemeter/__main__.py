import sys

from moemeter.cli import main

sys.exit(main())
