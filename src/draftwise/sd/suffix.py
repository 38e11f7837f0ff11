"""A suffix index over a corpus of token sequences (the target's own earlier outputs), with continuation counts.

`SuffixTrie` holds every substring of length ≤ `depth` of the corpus as a path from the root; a node counts the
occurrences of its path. Most long paths occur once, so a node seen once is kept *lazy*: no children, only where its
one occurrence ends in the corpus (`seq`, `pos`); the second occurrence to reach it expands it one level. The trie
then holds a node per repeated substring plus one per unique branch, not `depth` nodes per corpus token.

Queries (SuffixDecoding, Oliaro et al. 2024, as vLLM's `suffix` method):
  `longest_match(context)`   the longest suffix of the context (≤ `max_match` tokens) that occurs in the corpus; the
                             occurrence property is monotone in length, so a binary search finds it.
  `continuation(node, k)`    from the matched node, the most frequent child at each step while the path's estimated
                             probability Π count(child)/count(parent) stays ≥ `min_prob`, at most k tokens.
Sequences can be added and removed again (`add`/`remove` are exact inverses), so a run can learn from outputs of
finished requests and leave out the output of the request being decoded.
"""

from __future__ import annotations

from collections.abc import Sequence


class Node:
    __slots__ = ("count", "children", "seq", "pos", "best")

    def __init__(self, count: int, seq: int, pos: int, children: dict | None = None):
        self.count = count  # occurrences of this node's path in the corpus
        self.children = children  # token -> Node; None while lazy: at most one occurrence (seq, pos) continues
        self.seq, self.pos = seq, pos  # one occurrence of the path ends just before corpus[seq][pos]
        self.best = None  # cached (token, child) of the largest count; None when stale


class SuffixTrie:
    def __init__(self, depth: int = 32):
        if depth < 2:
            raise ValueError(f"depth must be >= 2, got {depth}")
        self.depth = depth
        self.corpus: list[list[int] | None] = []  # removed sequences leave None (ids stay stable)
        self.root = Node(0, -1, 0, {})

    @property
    def sequences(self) -> int:
        return sum(s is not None for s in self.corpus)

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.corpus if s is not None)

    def add(self, tokens: Sequence[int]) -> int:
        """Index a sequence; returns its id (for `remove`)."""
        sid = len(self.corpus)
        self.corpus.append(list(tokens))
        for i in range(len(tokens)):
            self._walk(sid, i, +1)
        return sid

    def remove(self, sid: int) -> None:
        """Undo `add(sid)`: every count it raised is lowered, nodes it alone held are dropped. Only lazy nodes read
        their reference occurrence; one that referred to the removed sequence keeps only occurrences that end at it, so
        it becomes a node without children: no remaining node refers to the removed text."""
        for i in range(len(self.corpus[sid])):
            self._walk(sid, i, -1)
        self.corpus[sid] = None

    def _walk(self, sid: int, i: int, sign: int) -> None:
        """Add (+1) or remove (−1) the occurrence of corpus[sid][i : i + depth] and of its prefixes."""
        seq, node = self.corpus[sid], self.root
        node.count += sign
        for d in range(min(self.depth, len(seq) - i)):
            if node.children is None:  # (when removing, a lazy node on the path was handled one step up)
                self._expand(node, d)
            token = seq[i + d]
            child = node.children.get(token)
            node.best = None
            if child is None:  # only when adding: the first occurrence of this path
                node.children[token] = Node(1, sid, i + d + 1)
                return
            child.count += sign
            if child.count == 0:  # only when removing: the path's last occurrence is gone
                del node.children[token]
                return
            if sign < 0 and child.children is None and child.seq == sid:
                child.children = {}  # the occurrences left all end here (a lazy node has one continuing occurrence)
                return
            node = child

    def _expand(self, node: Node, depth: int) -> None:
        """A lazy node is about to get a second occurrence: give it the child its first occurrence continues with."""
        node.children = {}
        seq = self.corpus[node.seq]
        if depth < self.depth and node.pos < len(seq):
            node.children[seq[node.pos]] = Node(1, node.seq, node.pos + 1)

    def find(self, pattern: Sequence[int]) -> Node | None:
        """The node of `pattern`'s path, or None when the corpus does not contain it (len(pattern) ≤ depth)."""
        node = self.root
        for d, token in enumerate(pattern):
            if node.children is None:  # lazy: the one occurrence must continue with the rest of the pattern
                seq, rest = self.corpus[node.seq], list(pattern[d:])
                if seq[node.pos : node.pos + len(rest)] != rest:
                    return None
                return Node(1, node.seq, node.pos + len(rest))
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def longest_match(self, context: Sequence[int], max_match: int) -> tuple[int, Node | None]:
        """(m, node): the longest suffix of `context` of length m ≤ max_match present in the corpus (0, None if
        none)."""
        lo, hi, best = 1, min(max_match, len(context), self.depth), (0, None)
        while lo <= hi:  # if the m-token suffix occurs, so does every shorter one
            m = (lo + hi) // 2
            node = self.find(context[len(context) - m :])
            if node is not None:
                best, lo = (m, node), m + 1
            else:
                hi = m - 1
        return best

    def continuation(
        self, node: Node, matched: int, k: int, min_prob: float, shares: list[float] | None = None
    ) -> tuple[list[int], float]:
        """Up to k tokens after a matched node (at depth `matched`) and the path probability of the last one;
        `shares` gets each step's count(child) / count(parent)."""
        out, prob = [], 1.0
        while len(out) < k and matched + len(out) < self.depth:
            if node.children is None:  # lazy: one occurrence continues, the others (if any) end here
                seq = self.corpus[node.seq]
                if node.pos >= len(seq):
                    break
                token, child = seq[node.pos], Node(1, node.seq, node.pos + 1)
                p = prob / node.count
            else:
                if not node.children:
                    break
                if node.best is None:
                    node.best = max(node.children.items(), key=lambda kv: kv[1].count)
                token, child = node.best
                p = prob * child.count / node.count
            if p < min_prob:
                break
            if shares is not None:
                shares.append(p / prob)
            prob = p
            out.append(token)
            node = child
        return out, prob
