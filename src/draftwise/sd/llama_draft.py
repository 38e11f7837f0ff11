"""draftwise's lookup drafters inside llama-cpp-python: `Llama(model_path=..., draft_model=LookupDraftModel(...))`.

llama-cpp-python's `Llama.generate` asks its draft model for a proposal with the whole sequence so far (prompt +
output) after every verify pass, and keeps what the target's own sampling agrees with. `LookupDraftModel` answers
from a draftwise lookup session (n-gram over the request, or the suffix index over the target's own outputs): it keeps
the session's index in step with the sequence it is shown — the tokens shared with the previous call stay indexed,
the rest is cut and the new tokens appended — so a call costs what a draftwise round's proposal costs, not a scan of
the whole text.

    from llama_cpp import Llama
    from draftwise.sd.llama_draft import LookupDraftModel
    llm = Llama(model_path="target.gguf", draft_model=LookupDraftModel.from_spec("suffix:suffix-corpus,factor=2", 2))
"""

from __future__ import annotations

import numpy as np

from . import families
from .roles import Drafter

try:  # the base class when llama-cpp-python is installed (it checks nothing but the call signature)
    from llama_cpp.llama_speculative import LlamaDraftModel as _Base
except (ImportError, OSError):  # the adapter itself needs nothing from it
    _Base = object


class LookupDraftModel(_Base):
    """A draftwise lookup drafter (`NgramDrafter`, `SuffixDrafter`, ...) as a llama-cpp-python draft model proposing
    up to `num_pred_tokens` (γ) tokens per call."""

    def __init__(self, drafter: Drafter, num_pred_tokens: int):
        self.drafter, self.num_pred_tokens = drafter, num_pred_tokens
        self.session, self.seen = None, []

    @classmethod
    def from_spec(cls, spec: str, num_pred_tokens: int) -> LookupDraftModel:
        """From a draftwise lookup spec (`ngram[:...]`, `suffix[:DIR][,...]`, any registered lookup family)."""
        return cls(families.lookup(spec), num_pred_tokens)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        seq = [int(t) for t in input_ids]
        same = 0
        for a, b in zip(self.seen, seq):  # what the index holds of this sequence (a new request shares nothing)
            if a != b:
                break
            same += 1
        if self.session is None or same == 0:
            self.session = self.drafter.start([seq[:1]])
        else:
            self.session.keep(0, same)
        self.seen = seq
        draft = self.session.propose({0: seq}, self.num_pred_tokens)[0].tokens
        return np.array(draft, dtype=np.intc)
