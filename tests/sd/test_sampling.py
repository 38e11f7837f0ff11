import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.sd.sampling import SamplingParams, argmax, probs, sample


def test_greedy_is_one_hot_of_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    p = probs(logits, SamplingParams())
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert sample(p, torch.Generator().manual_seed(0)).tolist() == [1, 0]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(probs(logits, SamplingParams(temperature=0.5)), torch.softmax(logits / 0.5, -1))


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.7))  # 0.5 < 0.7 <= 0.8: keep the first two
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.5))  # the first alone reaches 0.5
    torch.testing.assert_close(p, torch.tensor([1.0, 0.0, 0.0, 0.0]))


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5)])
def test_bad_params(kw):
    with pytest.raises(DraftwiseError):
        SamplingParams(**kw)


def test_argmax_takes_the_first_maximum():
    logits = torch.tensor([[1.0, 3.0, 3.0], [5.0, 5.0, 0.0]])
    assert argmax(logits).tolist() == [1, 0] == logits.argmax(-1).tolist()


def test_sample_never_draws_a_zero_probability_token():
    p = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    draws = sample(p.expand(4000, 5), torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {1, 3} and abs((draws == 1).float().mean() - 0.5) < 0.05
