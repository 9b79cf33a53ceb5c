"""`python -m backend.verify ...`: see backend/verify/runner.py."""
from __future__ import annotations

import sys

from backend.verify.runner import main

if __name__ == "__main__":
    sys.exit(main())
