"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the sequence's own ending.

`NgramIndex` keeps, for every n-gram (min_n ≤ n ≤ max_n) of a growing token sequence, the positions where it ends,
in increasing order. Appending a token adds its ≤ max_n n-grams; truncating removes them again (each removed
position is the last of its n-grams' lists), so the index always equals a fresh index of the sequence it holds, and
a proposal costs O(max_n) dictionary lookups at any context length — never a rescan of the prompt.

A proposal (`propose(k)`): the longest n (max_n down to min_n) whose final n-gram also ends earlier; the latest such
earlier end e wins; the proposal copies the tokens that followed it. When the copy runs into the sequence's own end
(e close to the end: the text repeats with period L−1−e), it continues periodically with the tokens it has just
proposed, as the repetition would.
"""

from __future__ import annotations


class NgramIndex:
    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> end positions, increasing

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        self.tokens.append(token)
        end = len(self.tokens) - 1
        for n in range(self.min_n, min(self.max_n, end + 1) + 1):
            self.ends.setdefault(tuple(self.tokens[end - n + 1 :]), []).append(end)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens (a rollback): their n-grams' lists lose the removed end positions."""
        while len(self.tokens) > max(0, length):
            end = len(self.tokens) - 1
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                key = tuple(self.tokens[end - n + 1 :])
                positions = self.ends[key]
                positions.pop()  # `end` is the largest position of every n-gram ending there
                if not positions:
                    del self.ends[key]
            self.tokens.pop()

    def match(self) -> tuple[int, int] | None:
        """(n, e): the longest final n-gram that also ends earlier, and its latest earlier end e; None if none."""
        L = len(self.tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            positions = self.ends.get(tuple(self.tokens[L - n :]))
            if positions and len(positions) >= 2:  # the last entry is the sequence's own ending (L − 1)
                return n, positions[-2]
        return None

    def agreement(self, n: int, token: int, recent: int = 16) -> float:
        """Of the last `recent` earlier occurrences of the final n-gram, the fraction followed by `token`."""
        ends = self.ends.get(tuple(self.tokens[len(self.tokens) - n :]), [])[:-1][-recent:]
        return sum(self.tokens[e + 1] == token for e in ends) / len(ends) if ends else 0.0

    def continuation(self, end: int, k: int) -> list[int]:
        """k tokens after position `end`, continued periodically past the sequence's end."""
        L, out = len(self.tokens), []
        for i in range(k):
            j = end + 1 + i
            out.append(self.tokens[j] if j < L else out[j - L])
        return out

    def propose(self, k: int) -> list[int]:
        m = self.match()
        return self.continuation(m[1], k) if m and k > 0 else []
