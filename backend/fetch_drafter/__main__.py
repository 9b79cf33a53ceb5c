"""`python -m backend.fetch_drafter ...`: see backend/fetch_drafter/runner.py."""
from __future__ import annotations

import sys

from backend.fetch_drafter.runner import main

if __name__ == "__main__":
    sys.exit(main())
