"""The integer kernel's paths are proven by a smoke test in a child process and timed there before they are trusted:
each band of rows takes the fastest proven path, never one that died or disagreed; torch's bf16 product serves
prompt passes only where it was faster by the margin; the verdict is kept per CPU and kernel build and reread."""

import json

import pytest

from draftwise import machine
from draftwise.errors import DraftwiseError
from draftwise.runtimes.lean import kernels, ladder, rates

BEST = kernels._kernel().draftwise_int8_isa() if kernels.kernel_available() else 0
SIZES = [r for rows in ladder.ROWS for r in rows]
NAMES = [ladder.key(f, a) for f in ladder.FORMATS for a in ladder.ABITS]


def timings(per_row: dict[int, float], sizes=SIZES) -> dict:
    """A stand-in child's timings: `per_row[r]` seconds a pass of r rows, for every format."""
    return {
        "seconds": {n: {str(r): per_row[r] for r in sizes} for n in NAMES},
        "products": {str(r): r * 10**11 for r in SIZES},
    }


STEPPER = {r: 1.0 if r == 1 else 2.0 * r for r in SIZES}  # fast at one row, slow at many
BATCHER = {r: 1.5 if r == 1 else 1.0 * r for r in SIZES}  # the other way round


def test_each_band_takes_the_faster_of_two_proven_paths():
    route = ladder.choose({"avx512": timings(STEPPER), "avx2": timings(BATCHER)})
    for fmt in range(len(ladder.FORMATS)):
        for abits in ladder.ABITS:
            assert route.path(0, abits, fmt) == ladder.CODES["avx512"]
            assert [route.path(b, abits, fmt) for b in (1, 2, 3, 4)] == [ladder.CODES["avx2"]] * 4
    assert route.bands[0]["paths"]["q4k-a8"] == "avx512" and route.bands[4]["paths"]["q4k-a8"] == "avx2"
    assert route.bands[0]["rates"]["avx512"] > route.bands[0]["rates"]["avx2"]  # G products a second, measured
    assert route.label() == "avx512; short verify avx2" and route.short() == "avx512/avx2"
    assert not route.bf16


def test_a_path_that_died_or_disagreed_is_never_taken():
    route = ladder.choose({"avx512-seq": None, "avx512": timings(BATCHER), "avx2": timings(STEPPER)})
    assert set(route.table) == {ladder.CODES["avx512"], ladder.CODES["avx2"]}
    assert ladder.choose({"avx512": None, "avx2": None}).table == ladder.Route.one(0).table  # torch: the same function


def test_a_tie_keeps_the_path_tried_first_and_amx_never_serves_a_step():
    even = timings({r: float(r) for r in SIZES})
    route = ladder.choose({"amx": even, "avx512": even})
    assert route.path(0, 8, 3) == ladder.CODES["avx512"]  # AMX hands a one-row pass to AVX-512: never chosen there
    assert {route.path(b, 8, 3) for b in (1, 2, 3, 4)} == {ladder.CODES["amx"]}


def test_prompts_take_a_lossy_path_only_where_it_was_faster_by_its_margin():
    exact = timings({r: float(r) for r in SIZES})
    prompt_sizes = [r for b in ladder.PROMPT_BANDS for r in ladder.ROWS[b]]
    near = timings({r: 0.95 * r for r in SIZES}, prompt_sizes)  # faster, but not by the margin
    far = timings({r: 0.5 * r for r in SIZES}, prompt_sizes)
    assert not ladder.choose({"avx512": exact, ladder.BF16: near}).bf16
    route = ladder.choose({"avx512": exact, ladder.BF16: far})
    every = len(ladder.BANDS) * len(NAMES)
    assert len(route.bf16) == every  # prompt passes of every size: a prompt's cache is the same in any chunks
    assert set(route.table) == set(route.prompt) == {ladder.CODES["avx512"]}  # C's passes keep the exact path
    assert route.short() == "avx512+bf16" and dict(route.prompts)["q4-a16"] == ladder.BF16
    q8k = {"seconds": {n: far["seconds"][n] for n in ("q4k-a16", "q4k-a8")}, "products": far["products"]}
    route = ladder.choose({"avx512": exact, ladder.Q8K: q8k, ladder.BF16: timings({r: 0.7 * r for r in SIZES})})
    q4k, q4 = ladder.FORMATS.index("q4k"), ladder.FORMATS.index("q4")
    for band in range(len(ladder.BANDS)):
        assert route.lossy(band, 8, q4k) == ladder.Q8K
        assert route.prompt[route.index(band, 8, q4k)] == ladder.CODES[ladder.Q8K]
        assert route.lossy(band, 8, q4) == ladder.BF16  # a format q8k does not take: the other lossy path
        assert route.path(band, 8, q4k) == ladder.CODES["avx512"]  # passes whose logits are read: exact
    assert route.short() == "avx512+q8k+bf16" and route.label().endswith("+ q8k/bf16 prompts")


def test_the_verdict_is_kept_per_machine_and_reread(tmp_path):
    calls = []

    def run(path):
        calls.append(path)
        return None if path == "avx2" else timings(STEPPER if path == "avx512" else BATCHER)

    said = []
    first = ladder.proven(2, "build", tmp_path, run, say=lambda *a, **k: said.append(a[0]))
    assert calls == ["avx512", "avx512-seq", "avx2", "q8k", "bf16"] and len(said) == 1  # one line, the first time
    again = ladder.proven(2, "build", tmp_path, run, say=lambda *a, **k: said.append(a[0]))
    assert again == first and len(calls) == 5 and len(said) == 1  # reread, not timed again
    published = json.loads((tmp_path / machine.MATRIX_PATH_RECORD).read_text())
    assert published["cpu"] == machine.cpu_key() and published["path"] == first.label()
    assert published["tried"] == {"avx512": True, "avx512-seq": True, "avx2": False, "q8k": True, "bf16": True}
    assert [b["band"] for b in published["bands"]] == list(ladder.BANDS)
    ladder.proven(1, "build", tmp_path, run)  # another best (another CPU report): proven again
    assert calls[5:] == ["avx2", "q8k", "bf16"]  # q8k runs on AVX2 too
    record = next(tmp_path.glob("ladder-*.json"))
    kept = json.loads(record.read_text())
    kept["rows"] = [[1]]  # timed at other pass sizes (an older draftwise): timed again
    record.write_text(json.dumps(kept))
    ladder.proven(1, "build", tmp_path, run)
    assert calls[8:] == ["avx2", "q8k", "bf16"]


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_the_best_path_is_proven_and_timed_in_a_child(monkeypatch):
    monkeypatch.setenv(rates.SHAPES_ENV, "small")
    got = ladder.run_child(ladder.NAMES[BEST])
    assert set(got["seconds"]) == set(NAMES)
    assert all(set(got["seconds"][n]) == set(map(str, SIZES)) and min(got["seconds"][n].values()) > 0 for n in NAMES)
    assert got["products"]["8"] == 8 * sum(n * k for n, k in rates.shapes())


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_a_path_whose_child_dies_is_out(monkeypatch):
    """A stand-in that dies (the child aborts, as on SIGILL): the parent reads its status, nothing more."""
    monkeypatch.setenv("DRAFTWISE_SMOKE_DIE", ladder.NAMES[BEST])
    assert ladder.run_child(ladder.NAMES[BEST]) is None


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_the_machines_description_names_the_route():
    route = kernels.route()
    here = machine.facts()
    assert here["matrix_path"] == route.label()
    assert [b["band"] for b in here["matrix_route"]] == list(ladder.BANDS)
    assert f"int8/q4 kernel: {route.label()} (smoke-tested, timed)" in machine.line(here)


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_a_forced_path_is_one_path_everywhere_and_a_wrong_one_is_one_line(monkeypatch):
    monkeypatch.setenv(kernels.PATH_ENV, "avx2")
    kernels.route.cache_clear()
    try:
        assert set(kernels.route().table) == {ladder.CODES["avx2"]} and not kernels.route().bf16
        forced = kernels.forced(f"{ladder.NAMES[BEST]},bf16")
        assert set(forced.table) == {BEST} and len(forced.bf16) == len(ladder.BANDS) * len(NAMES)
        with pytest.raises(DraftwiseError, match="this CPU runs"):
            kernels.forced("avx1024")
    finally:
        kernels.route.cache_clear()
