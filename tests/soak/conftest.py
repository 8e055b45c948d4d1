"""The chaos soak runs for minutes (CHAOS_SECONDS per parametrization, 330 s by default), so it is collected only
when asked for: ``make soak`` sets TC_SOAK=1. `make test` and a plain ``pytest`` leave it out."""

from __future__ import annotations

import os

collect_ignore = [] if os.environ.get("TC_SOAK") == "1" else ["test_chaos_soak.py"]
