"""The run contract, the bottom room of the host side: run directories and their events, the run
lookup, plan files, exit codes, JSON lines, numbers and the host's stage names. It imports
nothing above it (tests/test_layers.py)."""
