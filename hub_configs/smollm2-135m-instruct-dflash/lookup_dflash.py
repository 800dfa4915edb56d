"""Context lookup: where the drafter is unsure, the block continues with what followed the same tokens earlier in
the context (prompt-lookup drafting, spliced into a DFlash block).

Part of the Hub payload: imports only torch, transformers and sibling modules.

With `lookup_threshold > 0` a round's block keeps the drafter's proposals up to the first slot whose drafter
distribution has its top probability below the threshold; from that slot on it proposes the tokens that followed
the latest earlier occurrence of the block's last `n` tokens (n = 3, else 2) in the context (the prompt, every token
committed since, and the block's kept proposals), when the context has one. Code and structured answers repeat their
prompt's names, signatures and phrases; the drafter, unsure there, hands those slots to the copy.

Which slot is spliced depends only on the drafter's distributions (not on a sampled proposal), and a spliced
proposal is a function of the context and the proposals before it: its proposal distribution is a point mass, which
the generator hands to transformers as such. Verification is transformers' own, so greedy output and sampled
distributions are unchanged; only the proposals change.
"""

from __future__ import annotations

ORDERS = (3, 2)  # n-gram lengths matched, longest first


class ContextLookup:
    """The context of one `generate()` call, indexed by its n-grams. `extend(tokens)` (or `update(input_ids)`) before
    each draft adds the tokens committed since the last one; `continuation(kept, count)` is the lookup proposal after
    them."""

    def __init__(self, orders: tuple = ORDERS):
        self.orders = tuple(sorted(orders, reverse=True))
        self.tokens: list = []
        # n-gram -> the latest position e with tokens[e - n:e] == n-gram and e < len(tokens) (a token follows it)
        self.latest = {n: {} for n in self.orders}

    def update(self, input_ids) -> None:
        """Reads the tokens of `input_ids` (1, L) past those already indexed."""
        self.extend(input_ids[0, len(self.tokens):].tolist())

    def extend(self, new: list) -> None:
        """Indexes `new`, the context's next tokens (the generator reads them to the host once a round)."""
        start = len(self.tokens)
        self.tokens += new
        for e in range(max(start, 1), len(self.tokens)):  # n-grams ending at e now have a token after them
            for n in self.orders:
                if e >= n:
                    self.latest[n][tuple(self.tokens[e - n:e])] = e

    def continuation(self, kept: list, count: int) -> list:
        """At most `count` tokens that followed the latest earlier occurrence of the last n tokens of context +
        `kept` (the longest n of `orders` that occurs), taken from context + `kept`; [] if none occurs."""
        if count <= 0:
            return []
        kept = list(kept)
        committed = len(self.tokens)
        end = committed + len(kept)
        # The last `max(orders)` committed tokens and the kept proposals: every window the search below reads past
        # the index, without copying the whole context each round. Position i of context + kept is recent[i - offset].
        offset = max(0, committed - self.orders[0])
        recent = self.tokens[offset:] + kept
        for n in self.orders:
            if end <= n:
                continue
            query = recent[end - n - offset:]
            # Occurrences ending at or after the committed context's end (inside `kept`, not yet indexed) are later
            # than any indexed one: look there first.
            found = next((e for e in range(end - 1, max(committed, n) - 1, -1)
                          if recent[e - n - offset:e - offset] == query), None)
            if found is not None:
                return recent[found - offset:found - offset + count]
            found = self.latest[n].get(tuple(query))
            if found is not None:  # an indexed occurrence: what followed it, running on into `kept` if needed
                head = self.tokens[found:found + count]
                return head + kept[:count - len(head)]
        return []
