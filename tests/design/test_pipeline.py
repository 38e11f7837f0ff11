import json
import os

import pytest

from conftest import held
from draftwise import design
from draftwise.config import DesignConfig


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_each_stage_records_its_own_peak_memory(tiny_dir, tmp_path):
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    big = p.stage("big", lambda f: held(256))
    small = p.stage("small", lambda f: None)  # counts from what the process holds after "big": not its 256 MB
    assert big["peak_gb"] - small["peak_gb"] > 0.2
    assert json.loads((tmp_path / "d" / "stages" / "big" / "done.json").read_text())["peak_gb"] == big["peak_gb"]
