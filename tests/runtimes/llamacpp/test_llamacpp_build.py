"""Set-up's llama.cpp build: the ladder of instruction sets a CPU allows, and the choice of the first build whose smoke
test passes — shown with stand-in binaries that die by a signal, on any machine."""

from __future__ import annotations

import os
import stat

import pytest

from draftwise.errors import DraftwiseError
from draftwise.runtimes.llamacpp import build as lb
from draftwise.runtimes.llamacpp import smoke as smoke_steps

SAPPHIRE_RAPIDS = set(
    "sse4_2 avx f16c fma avx2 bmi2 avx_vnni avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni "
    "avx512_bf16 avx512_fp16 amx_tile amx_int8 amx_bf16".split()
)
ZEN4 = SAPPHIRE_RAPIDS - {"amx_tile", "amx_int8", "amx_bf16", "avx512_fp16", "avx_vnni"}
HASWELL = set("sse4_2 avx f16c fma avx2 bmi2".split())


def names(flavours):
    return [f.name for f in flavours]


def test_the_ladder_tries_amx_only_where_the_os_grants_it_then_steps_down():
    assert names(lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "on request")) == ["amx", "native", "avx2", "baseline"]
    assert names(lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "refused")) == ["native", "avx2", "baseline"]
    assert names(lb.ladder(ZEN4, "x86_64", "no")) == ["native", "avx2", "baseline"]
    assert names(lb.ladder(HASWELL, "x86_64", "no")) == ["native", "baseline"]  # native is the AVX2 rung there
    assert names(lb.ladder({"sse4_2"}, "x86_64", "no")) == ["native", "baseline"]
    assert names(lb.ladder(set(), "aarch64", "no")) == ["native", "baseline"]


def test_every_rung_sets_every_instruction_set_option_and_only_what_the_cpu_has():
    amx, native, avx2, baseline = lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "on request")
    for f in (amx, native, avx2, baseline):
        assert ("GGML_NATIVE", "OFF") in f.options and len(f.options) == 1 + len(lb.X86)
    assert {"AMX_TILE", "AMX_INT8", "AVX512_VNNI"} <= set(amx.enabled())
    assert not set(lb.AMX) & set(native.enabled()) and "AVX512_BF16" in native.enabled()
    assert avx2.enabled() == list(lb.AVX2_LEVEL) and baseline.enabled() == []
    zen4_native = lb.ladder(ZEN4, "x86_64", "no")[0]
    assert "AVX_VNNI" not in zen4_native.enabled() and "AVX512_VNNI" in zen4_native.enabled()


def stand_in(tmp_path, name: str, body: str) -> str:
    """An executable script standing in for llama-bench."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_build_whose_smoke_test_dies_by_a_signal_is_replaced_by_the_next_rung(tmp_path):
    dies = stand_in(tmp_path, "dies", "kill -ILL $$")
    passes = stand_in(tmp_path, "passes", 'echo "{}"')
    built = []
    flavours = lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "on request")
    smoke = {"amx": dies, "native": passes}

    chosen, attempts = lb.choose(
        flavours, built.append, lambda f: {"out": smoke_steps.run_checked([smoke[f.name]], f"{f.name}'s smoke test")}
    )
    assert chosen.name == "native" and names(built) == ["amx", "native"]
    assert [(a.flavour, a.passed) for a in attempts] == [("amx", False), ("native", True)]
    assert attempts[0].reason == "amx's smoke test died with SIGILL"


def test_a_build_that_fails_to_compile_steps_down_too_and_none_passing_stops_setup_in_one_line(tmp_path):
    segv = stand_in(tmp_path, "segv", "kill -SEGV $$")
    fails = stand_in(tmp_path, "fails", 'echo "cannot load model" >&2; exit 3')

    def build(f):
        if f.name == "avx2":
            raise DraftwiseError("building llama.cpp failed (exit 2)")

    def smoke(f):
        return smoke_steps.run_checked([fails if f.name == "baseline" else segv], "llama-bench")

    with pytest.raises(DraftwiseError) as e:
        lb.choose(lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "refused"), build, smoke)
    message = str(e.value)
    assert "\n" not in message and message.startswith("no llama.cpp build passed its smoke test on this machine")
    assert "native: llama-bench died with SIGSEGV" in message
    assert "avx2: building llama.cpp failed (exit 2)" in message
    assert "baseline: llama-bench failed (exit 3): cannot load model" in message


def test_a_full_disk_stops_the_ladder_at_once_saying_how_much_is_free(tmp_path):
    full = stand_in(tmp_path, "full", 'echo "ERROR: [Errno 28] No space left on device"; exit 1')
    built = []

    def build(f):
        built.append(f.name)
        lb._step([full], "installing the llama.cpp bindings", tmp_path / "logs" / "bindings.log")

    with pytest.raises(lb.NotTheRung) as e:
        lb.choose(lb.ladder(SAPPHIRE_RAPIDS, "x86_64", "refused"), build, lambda f: {})
    message = str(e.value)
    assert built == ["native"]  # no rung lower is built: it would fill the same disk
    assert "\n" not in message and message.startswith("installing the llama.cpp bindings ran out of disk space (")
    assert f"MB free in {tmp_path / 'logs'}" in message and "free some and run setup again" in message


def test_a_smoke_step_that_hangs_is_stopped():
    with pytest.raises(DraftwiseError, match="did not finish in 1 s"):
        smoke_steps.run_checked(["sleep", "5"], "a hanging smoke test", timeout=1)


@pytest.mark.skipif(lb.record_path() is None, reason="llama.cpp is not built here (scripts/setup.sh)")
def test_setup_left_a_record_of_the_build_it_proved_here():
    """On a machine set up by scripts/setup.sh: the build it kept passed its smoke test, for this very CPU."""
    import json

    path = lb.record_path()
    if not path.is_file():
        pytest.skip("llama.cpp was built before build records existed: rerun scripts/setup.sh")
    record = json.loads(path.read_text())
    assert record["attempts"][-1]["passed"] and record["flavour"] == record["attempts"][-1]["flavour"]
    assert record["fingerprint"] == lb.fingerprint()
    assert set(record["smoke"]["tools"]) == {"pp40", "pp4", "tg4"} and os.path.isfile(path)
