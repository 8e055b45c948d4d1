"""``python -m tc_server.audit``: the same as ``tc-audit``."""

import sys

from tc_server.audit.cli import main

sys.exit(main())
