import sys
from pathlib import Path

# the sweep's catalogue and checks (bench/zoo_catalog.py, bench/zoo_checks.py), shared with bench/zoo_sweep.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
