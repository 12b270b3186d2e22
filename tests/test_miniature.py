"""The miniature (experiments/miniature.py) at its toy size: it completes and prints its table."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_miniature_runs_at_toy_size_and_prints_the_table(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, str(REPO / "experiments" / "miniature.py"), "--size", "toy", "--seeds",
                             "0", "--device", "cpu"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = {name: float(value) for name, value in re.findall(
        r"^(teacher \(clean text\)|student at init|plain|vocagno|random)\s+([0-9.]+)\s+[0-9.]+$", result.stdout,
        re.MULTILINE)}
    assert set(rows) == {"teacher (clean text)", "student at init", "plain", "vocagno", "random"}, result.stdout
    # Every trained student learned something: below the bits per byte of its initialization.
    assert all(0 < rows[method] < rows["student at init"] for method in ("plain", "vocagno", "random")), rows
