"""Target-generated text: which prompts a stage continues."""

from draftwise import continuations, data
from draftwise.runtimes.registry import load


def test_prompts_rotate_over_suites_before_categories(tiny_dir):
    """MMLU has dozens of subject categories: a prefix of the order must still cover every suite."""
    target = load(tiny_dir)
    prompts = continuations.prompts_for(target, "eval", "all", max_prompt_tokens=4096, limit=len(data.SUITES))
    assert sorted(p.suite for p, _ in prompts) == sorted(data.SUITES)
    spec = continuations.prompts_for(target, "eval", "spec_bench", max_prompt_tokens=4096, limit=13)
    assert len({p.category for p, _ in spec}) == 13  # within a suite, its categories in turn
