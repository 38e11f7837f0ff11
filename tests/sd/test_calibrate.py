import pytest
import torch
from test_loop import lean

from conftest import tiny_config
from draftwise.errors import DraftwiseError
from draftwise.sd import calibrate
from draftwise.sd.lookup import NgramDrafter, SuffixDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams, probs
from draftwise.sd.schedule import Calibration, Scheduler, VerifyCurve
from draftwise.sd.suffix import SuffixTrie

PROMPTS = ([1, 5, 9, 13, 5, 9, 13, 5, 9, 21, 22, 5, 9, 13], [1, 20, 21, 22, 20, 21], [3])


@pytest.fixture(scope="module")
def target():
    return lean(tiny_config(vocab=64, layers=2), seed=21)


def lookups():
    trie = SuffixTrie(16)
    trie.add([5, 9, 13, 5, 9, 21, 22, 23, 24])
    return {"ngram": NgramDrafter(1, 4), "suffix": SuffixDrafter(trie, factor=2, min_prob=0.1)}


@pytest.mark.parametrize("kind", ["ngram", "suffix"])
def test_the_greedy_replay_observes_what_a_scheduled_run_verifying_everything_observes(target, kind):
    """Greedy SD emits the target's greedy text, so replaying a lookup over that text reproduces every proposal; with a
    free verify curve the scheduler verifies each proposal whole and observes up to the first rejection, as the
    replay does up to the first disagreement: the two tables are equal, bin for bin."""
    offline, gamma = Calibration(), 4
    online = Scheduler(VerifyCurve((1.0,) * (gamma + 1)))
    for prompt in PROMPTS:
        text = generate(target, prompt, SamplingParams(), 30, torch.Generator()).tokens
        calibrate.observe_text(offline, lookups()[kind], prompt, text, gamma)
        run = generate(
            target,
            prompt,
            SamplingParams(),
            30,
            torch.Generator(),
            drafter=lookups()[kind],
            gamma=gamma,
            scheduler=Scheduler(online.curve, online.calibration),
        )
        assert run.tokens == text
        online.commit([r.__dict__ for r in run.rounds])
    assert offline.counts and offline.counts == online.calibration.counts


class Recorder:
    def __init__(self):
        self.seen: list[tuple[str, float]] = []

    def observe(self, feature: str, accept_prob: float) -> None:
        self.seen.append((feature, accept_prob))


def test_a_sampled_temperature_observes_the_targets_probability_of_each_proposed_token(target):
    """At T > 0 a reached position counts min(1, p_T(x)), p_T the target's distribution after the text so far: checked
    against one fresh target pass per prefix (so the teacher-forced pass is aligned token for token)."""
    prompt, params = PROMPTS[0], SamplingParams(0.7)
    text = generate(target, prompt, SamplingParams(), 24, torch.Generator()).tokens
    content = calibrate.calibrate(
        target, [{"prompt": prompt, "continuation": text}], {"ngram": (NgramDrafter(1, 4), 3)}, (0.0, 0.7)
    )
    greedy, sampled = (content["temperatures"][t]["counts"] for t in ("0", "0.7"))
    assert {k: v[0] for k, v in greedy.items()} == {k: v[0] for k, v in sampled.items()} != {}  # the same positions

    seen = Recorder()
    calibrate.observe_text(
        seen, NgramDrafter(1, 4), prompt, text, 3, probs(calibrate.text_logits(target, prompt, text), params)
    )
    expected, session, seq, t = [], NgramDrafter(1, 4).start([prompt]), list(prompt), 0
    while t < len(text):  # the same walk, each proposed token priced by a fresh forward over its own prefix
        g = min(3, len(text) - t - 1)
        accepted = 0
        for j, x in enumerate(session.propose({0: seq}, g)[0].tokens if g > 0 else []):
            prefix = prompt + text[: t + j]
            target.reset(1, len(prefix))
            expected.append(min(1.0, float(probs(target.forward(torch.tensor([prefix]), 0, 1)[0, -1], params)[x])))
            if x != text[t + j]:
                break
            accepted += 1
        seq += text[t : t + accepted + 1]
        t += accepted + 1
        session.keep(0, len(seq) - 1)
    assert [a for _, a in seen.seen] == pytest.approx(expected, abs=1e-5)
    assert sum(n for k, (n, _) in sampled.items() if k == "own") == len(expected)


def test_a_calibration_folder_round_trips_and_names_what_it_lacks(tmp_path):
    table = Calibration()
    table.observe("own|p1|n2|g3", 1.0)
    table.observe("own|p2|n2|g3", 0.25)
    content = {"temperatures": {"0": {"positions": 2, "counts": table.counts}}, "drafters": {"ngram": 4}}
    calibrate.write(tmp_path / "cal", content)
    assert calibrate.is_calibration(tmp_path / "cal") and not list((tmp_path / "cal").glob("*.tmp"))
    assert calibrate.load(tmp_path / "cal", 0.0).counts == table.counts
    with pytest.raises(DraftwiseError, match=r"no calibration at T=0.5 \(it has T = 0\)"):
        calibrate.load(tmp_path / "cal", 0.5)
    with pytest.raises(DraftwiseError, match="not a calibration folder"):
        calibrate.load(tmp_path, 0.0)
