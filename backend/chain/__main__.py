"""`python -m backend.chain --work-dir W --run-id ID --plan PLAN.json [--fresh]` (see __init__.py).

Exit codes: 0 every stage completed (or the chain was stopped cleanly), 1 a stage did not complete,
2 an unusable plan or run directory (nothing was started).
"""
from __future__ import annotations

import sys

from backend.chain.runner import main

if __name__ == "__main__":
    sys.exit(main())
