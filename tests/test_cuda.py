"""The GPU path: the lean engine on CUDA (fp32 and bf16), CUDA-event timing, and profile/sweep/bench records that
name their device. Marked `cuda`: skipped without a GPU; `scripts/gpu_check.sh` runs them on a GPU machine."""

import json

import pytest
import torch

from draftwise.config import BenchConfig, ProfileConfig, SweepConfig
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages import bench, profile, sweep
from draftwise.timing import measure

pytestmark = pytest.mark.cuda


def test_lean_forward_on_cuda_matches_cpu(tiny_dir):
    cpu, gpu = load(tiny_dir).lm, load(tiny_dir, ModelOptions(device="cuda")).lm
    ids = torch.tensor([[1, 5, 9, 13]])
    cpu.reset(1, 8)
    gpu.reset(1, 8)
    torch.testing.assert_close(gpu.forward(ids.cuda(), 0).cpu(), cpu.forward(ids, 0), atol=1e-3, rtol=1e-3)


def test_bf16_forward_on_cuda_is_close_to_fp32(tiny_dir):
    fp32, bf16 = (load(tiny_dir, ModelOptions(dtype=d, device="cuda")).lm for d in ("fp32", "bf16"))
    ids = torch.tensor([[1, 5, 9, 13]], device="cuda")
    for lm in (fp32, bf16):
        lm.reset(1, 8)
    a, b = fp32.forward(ids, 0).float(), bf16.forward(ids, 0).float()  # [1, 1, V]
    assert (a - b).abs().max() < 0.05 * a.abs().max()


def test_greedy_sd_equals_ar_on_cuda(tiny_dir):
    target = load(tiny_dir, ModelOptions(device="cuda"))
    drafter = load_drafter("layers:0,2", target, ModelOptions(device="cuda"))
    params = SamplingParams(0.0, 1.0)
    prompt = target.encode("w1 w2 w3")
    ar = generate(target.lm, prompt, params, 24, torch.Generator("cuda").manual_seed(0))
    sd = generate(target.lm, prompt, params, 24, torch.Generator("cuda").manual_seed(0), drafter=drafter.lm, gamma=3)
    assert sd.tokens == ar.tokens


def test_cuda_event_timing_counts_gpu_work():
    x = torch.randn(2048, 2048, device="cuda")
    small = min(measure(lambda: x @ x, "cuda", 2, 5))
    big = min(measure(lambda: [x @ x for _ in range(8)], "cuda", 2, 5))
    assert 0 < small < big  # 8 matmuls measured as more time than 1: queued work is counted


def test_profile_sweep_and_synthetic_bench_on_cuda_in_bf16(tmp_path):
    target = "random:layers=4,hidden=256,heads=4,kv_heads=4,ffn=512,vocab=1000"
    out = profile.run(
        ProfileConfig(
            target=target,
            drafters=("random:layers=1",),
            depths=(1, 2),
            gammas=(1, 3),
            batches=(1,),
            context=64,
            warmup=1,
            repeats=3,
            dtype="bf16",
            device="cuda",
        ),
        tmp_path / "p",
    )
    machine = json.loads((out / "profile.json").read_text())["machine"]
    assert machine["device"] == "cuda" and machine["dtype"] == "bf16" and machine["engine"] == "lean"
    out = sweep.run(
        SweepConfig(
            target=target,
            budget="2M",
            layers=(1, 2),
            widths=(128, 256),
            width_depth=1,
            truncations=(1, 2),
            context=64,
            batches=(1,),
            warmup=1,
            repeats=3,
            dtype="bf16",
            device="cuda",
        ),
        tmp_path / "s",
    )
    assert json.loads((out / "sweep.json").read_text())["machine"]["device_name"] == torch.cuda.get_device_name()
    out = bench.run(
        BenchConfig(
            target=target,
            drafter="random:layers=1",
            gamma=3,
            synthetic_alpha=0.7,
            limit=2,
            max_new_tokens=32,
            dtype="bf16",
            device="cuda",
        ),
        tmp_path / "b",
    )
    summary = json.loads((out / "summary.json").read_text())
    assert 1 < summary["tar"] <= 4 and summary["greedy_identical_to_ar"] is None
