"""The machine a figure comes from: CPU and OS features, OpenMP's spin settings, bandwidth and its limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from draftwise import machine

CPUINFO = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8480C
flags		: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 amx_tile amx_int8

processor	: 1
model name	: Intel(R) Xeon(R) Platinum 8480C
flags		: fpu sse4_2 avx
"""


def test_cpuinfo_reads_the_model_and_the_first_processors_flags(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    model, flags = machine.cpuinfo(str(tmp_path / "cpuinfo"))
    assert model == "Intel(R) Xeon(R) Platinum 8480C"
    assert {"avx512_vnni", "amx_int8"} <= flags and "fpu" in flags
    assert machine.amx({"avx2"}) == "no"


def test_openmp_settings_that_spin_are_warned_about():
    assert machine.openmp({})["warnings"] == []
    quiet = machine.openmp({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "1000"})
    assert quiet["warnings"] == [] and quiet["env"]["OMP_WAIT_POLICY"] == "passive"
    loud = machine.openmp({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "infinite", "KMP_BLOCKTIME": "infinite"})
    assert len(loud["warnings"]) == 3 and all("steal each other's cores" in w for w in loud["warnings"])


def test_the_share_of_the_bandwidth_limit():
    m = {"bandwidth": {"read_gb_per_s": 20.0}}
    assert machine.limit(100_000_000, m) == 200.0  # 20 GB/s over 0.1 GB a step
    assert machine.share(50.0, 100_000_000, m) == 0.25
    assert machine.share(None, 100_000_000, m) is None and machine.share(50.0, 1, {}) is None


def test_facts_name_the_cpu_its_features_and_the_threads_and_a_line_says_them():
    f = machine.facts(threads=2)
    assert f["cores"] >= 1 and f["threads"] == 2 and set(f["isa"]) <= set(machine.ISA)
    assert f["amx"] in ("no", "refused", "on request") and f["memory"]["total_gib"] > 0
    assert f["cpu"] in machine.line(f) and "bandwidth not measured" in machine.line(f)


def test_bandwidth_is_measured_once_and_a_child_process_reuses_it(monkeypatch):
    monkeypatch.delenv(machine.BANDWIDTH_ENV, raising=False)
    first = machine.bandwidth(1)
    assert first["read_gb_per_s"] > 0.1 and first["threads"] == 1 and first["buffer_mib"] >= 64
    rates = first["readers_gb_per_s"]  # read two ways, the faster kept: each is a lower bound on the memory's rate
    assert set(rates) == {"matrix-vector product", "sum"} and first["read_gb_per_s"] == max(rates.values())
    assert rates[first["reader"]] == first["read_gb_per_s"]
    assert machine.bandwidth(1) == first
    code = "import json; from draftwise import machine; print(json.dumps(machine.bandwidth(1)))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert json.loads(child.stdout) == first  # from the environment, not measured again
