"""Running a benchmark script as on a stock install: what tests of benchmarks/ use to show a script needs
neither pytest nor anything from tests/."""
from __future__ import annotations

# run as `python -I -c GUARDED SCRIPT ARGS...` (-I: no PYTHONPATH, no user site, not the current directory);
# pytest and tests/ made unimportable
GUARDED = ("import runpy, sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; sys.argv = sys.argv[1:]; "
           "runpy.run_path(sys.argv[0], run_name='__main__')")
