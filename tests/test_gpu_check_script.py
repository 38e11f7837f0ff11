"""scripts/gpu_check.sh, dry-run on the CPU with tiny shapes (DRAFTWISE_GPU_CHECK=tiny): every step it takes on a GPU
machine — shape sweep, profile, cost-model prediction, synthetic-acceptance bench grid, summary — runs and lands in
one folder. (On a GPU machine the script also runs the CUDA-marked tests.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_script_dry_run(tmp_path):
    env = {**os.environ, "DRAFTWISE_GPU_CHECK": "tiny", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for path in ("sweep/sweep.json", "profile/profile.json", "predict.json", "bench/grid.json", "summary.txt"):
        assert (tmp_path / path).stat().st_size > 0, path
    summary = (tmp_path / "summary.txt").read_text()
    assert "step ms vs layers at full width: 1L" in summary and "deep / wide step at equal parameters" in summary
    grid = json.loads((tmp_path / "bench" / "grid.json").read_text())
    assert len(grid["points"]) == 2 * 2 and all(p["tar"] > 1 for p in grid["points"])
