"""This tool's earlier name: `tools/run_engines.py` (the evidence records' commands name this one)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_engines import main

if __name__ == "__main__":
    sys.exit(main())
