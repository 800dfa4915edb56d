"""The drafter's head: the target's LM head, a draft vocabulary of it, and that vocabulary grown by the context.

Part of the Hub payload: imports only torch, transformers and sibling modules.

A drafter with `draft_vocab_size` (FR-Spec / EAGLE-3) proposes from the rows `draft_to_target` of the target's LM
head, and the logits it hands to transformers are -inf outside them. With `draft_vocab_context=True` a
`generate()` call also proposes from every token of its context (the prompt and each token committed since) that
the saved vocabulary lacks: an identifier or a name the prompt introduced is then proposable, where the fixed
vocabulary, chosen from the training data's frequencies, ends the round at it. The added ids are more rows of the
same LM head (no weights), and the logits keep -inf exactly where no proposal can come from, so greedy output and
sampled distributions are unchanged; only which tokens the drafter can propose grows.
"""

from __future__ import annotations

import bisect

import torch
import torch.nn.functional as F


class DraftHeadMixin:
    """The head methods of `DFlashDrafter` (which holds `config`, `draft_to_target` and the three caches below).

    `extra_ids` (a method argument): target ids outside `draft_to_target`, ascending, appended to the draft
    vocabulary for one call (`ContextVocabulary.ids`); None for none."""

    _head_rows = None  # (key, rows of the target's LM head for the draft vocabulary (and bias rows))
    _draft_order = None  # (key, argsort of draft_to_target, draft_to_target sorted): greedy_proposals
    _extra_rows = None  # (key, the extra_ids tensor they were gathered for, rows, bias rows): one generate() call

    def release_call_caches(self):
        """Drops what belongs to one `generate()` call (the rows of its context's tokens); the dispatch calls it
        when the call returns. The draft vocabulary's own rows stay cached: the next call reuses them."""
        self._extra_rows = None

    def set_draft_vocabulary(self, target_ids):
        """Restricts the drafter's head to `target_ids` (distinct target token ids; saved with the weights)."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
        if ids.numel() == 0 or ids.unique().numel() != ids.numel():
            raise ValueError("A draft vocabulary needs at least one token id and no id twice.")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"Draft vocabulary ids must be target token ids in 0..{self.config.vocab_size - 1}.")
        self.config.draft_vocab_size = int(ids.numel())
        self.draft_to_target = ids.to(self.fc.weight.device)
        self._head_rows = self._draft_order = self._extra_rows = None
        return self

    def compute_logits(self, hidden_states: torch.Tensor, lm_head, extra_ids=None) -> torch.Tensor:
        """Drafter logits over the target's full vocabulary (z-lab's multiplier and softcap conventions).

        With a draft vocabulary, tokens outside it (and outside `extra_ids`) get -inf: they are never proposed and
        have zero proposal probability, so greedy matching and speculative sampling stay exact."""
        logits = self.compute_draft_logits(hidden_states, lm_head, extra_ids)
        if self.draft_to_target is None:
            return logits
        ids = self.draft_to_target.to(logits.device)
        if extra_ids is not None:
            ids = torch.cat([ids, extra_ids.to(logits.device)])
        full = logits.new_full((*logits.shape[:-1], lm_head.weight.shape[0]), float("-inf"))
        return full.index_copy_(full.dim() - 1, ids, logits)

    def greedy_proposals(self, hidden_states: torch.Tensor, lm_head, with_confidence: bool = False,
                         extra_ids=None) -> tuple:
        """(argmax proposals as target token ids (b, k), each proposal's drafter probability (k,) for the first
        sequence if `with_confidence`, else None), without building full-vocabulary logits.

        The same tokens as `compute_logits(...).argmax(-1)`: with a draft vocabulary the argmax runs over the draft
        logits in ascending target-id order, so ties go to the lowest target id as they do over the full logits
        (between the saved vocabulary's best and `extra_ids`' best too)."""
        logits = self.compute_draft_logits(hidden_states, lm_head)
        if self.draft_to_target is not None:
            key = (self.draft_to_target.data_ptr(), _version(self.draft_to_target), logits.device,
                   torch.is_inference_mode_enabled())
            if self._draft_order is None or self._draft_order[0] != key:
                sorted_ids, order = self.draft_to_target.sort()
                self._draft_order = (key, order.to(logits.device), sorted_ids.to(logits.device))
            logits = logits.index_select(-1, self._draft_order[1])
        chosen = logits.argmax(dim=-1)
        ids = chosen if self.draft_to_target is None else self._draft_order[2][chosen]
        extra = None
        if extra_ids is not None:  # the best extra id wins where its logit is higher, or equal at a lower id
            extra = self._extra_logits(hidden_states, lm_head, extra_ids)
            extra_chosen = extra.argmax(dim=-1)
            extra_pick = extra_ids.to(extra.device)[extra_chosen]
            best = logits.gather(-1, chosen[..., None])[..., 0]
            extra_best = extra.gather(-1, extra_chosen[..., None])[..., 0]
            take = (extra_best > best) | ((extra_best == best) & (extra_pick < ids))
            ids = torch.where(take, extra_pick, ids)
            chosen = torch.where(take, logits.shape[-1] + extra_chosen, chosen)  # index into [draft, extra] logits
        confidence = None
        if with_confidence:
            pool = logits if extra is None else torch.cat([logits, extra], dim=-1)
            confidence = pool[0].float().softmax(dim=-1).gather(-1, chosen[0, :, None])[:, 0]
        return ids, confidence

    def compute_draft_logits(self, hidden_states: torch.Tensor, lm_head, extra_ids=None) -> torch.Tensor:
        """Logits over the draft vocabulary (`draft_to_target` order, then `extra_ids`), or the full one without a
        draft vocabulary."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        hidden_states = hidden_states.to(device=weight.device, dtype=weight.dtype)  # the generator's [:, 1:] slice
        if self.draft_to_target is None:
            if extra_ids is not None:
                raise ValueError("extra_ids extend a draft vocabulary; this drafter proposes from the full one.")
            return self._finish_logits(_linear_rows(lm_head, hidden_states))
        # the draft vocabulary's rows of the target's head, cached while the head is unchanged
        # (rows gathered under generate()'s inference mode cannot enter autograd: the mode is part of the key)
        key = (weight.data_ptr(), _version(weight), weight.dtype, weight.device, self.draft_to_target.data_ptr(),
               _version(self.draft_to_target), torch.is_inference_mode_enabled())
        if self._head_rows is None or self._head_rows[0] != key:
            ids = self.draft_to_target.to(weight.device)
            self._head_rows = (key, weight.detach()[ids], None if bias is None else bias.detach()[ids])
        logits = self._finish_logits(_linear_rows(F.linear, hidden_states, *self._head_rows[1:]))
        if extra_ids is None:
            return logits
        return torch.cat([logits, self._extra_logits(hidden_states, lm_head, extra_ids)], dim=-1)

    def _extra_logits(self, hidden_states, lm_head, extra_ids) -> torch.Tensor:
        """Logits of the `extra_ids` rows of the target's head (cached for the same tensor and head)."""
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        key = (weight.data_ptr(), _version(weight), weight.dtype, weight.device, torch.is_inference_mode_enabled())
        if self._extra_rows is None or self._extra_rows[0] != key or self._extra_rows[1] is not extra_ids:
            ids = extra_ids.to(weight.device)  # the cache holds extra_ids itself, so `is` cannot match a new tensor
            self._extra_rows = (key, extra_ids, weight.detach()[ids], None if bias is None else bias.detach()[ids])
        hidden_states = hidden_states.to(device=weight.device, dtype=weight.dtype)
        return self._finish_logits(_linear_rows(F.linear, hidden_states, *self._extra_rows[2:]))

    def _finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        softcap = self.config.final_logit_softcapping
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits


class ContextVocabulary:
    """What one `generate()` call adds to a drafter's draft vocabulary (`draft_vocab_context=True`): every token
    of its context outside the saved `draft_to_target`. `extend(tokens)` (or `update(input_ids)`) before each draft
    adds the tokens committed since the last one; `ids` is then the added ids, ascending (None while there are none).

    `prompt_mask` (the prompt's attention mask, (1, P), or None): its masked positions (a left-padded prompt's pad
    tokens) are not context and add nothing. The added ids are at most the head's rows outside the saved vocabulary,
    so drafting costs at most what the full head costs; `DFlashStats.draft_vocab_added` reports how many a call
    added."""

    def __init__(self, draft_to_target: torch.Tensor, num_rows: int, prompt_mask=None):
        self.known = bytearray(num_rows)  # 1 = proposable: in the saved vocabulary or added
        for token in draft_to_target.tolist():
            self.known[token] = 1
        self.added: list = []
        self.ids = None
        self.seen = 0  # positions of input_ids already read
        self.masked = set()  # prompt positions that are not context (padding)
        if isinstance(prompt_mask, torch.Tensor) and prompt_mask.dim() == 2 and not bool(prompt_mask.all()):
            self.masked = set((prompt_mask[0] == 0).nonzero()[:, 0].tolist())

    def update(self, input_ids: torch.Tensor):
        """Adds the new context tokens of `input_ids` (1, L) outside the vocabulary; returns `ids`."""
        return self.extend(input_ids[0, self.seen:].tolist(), input_ids.device)

    def extend(self, tokens: list, device=None):
        """Adds the context's next `tokens` (read to the host once a round by the generator) where they lie outside the
        vocabulary; returns `ids` (a new tensor on `device` when it grew)."""
        fresh = {t for i, t in enumerate(tokens, self.seen)
                 if 0 <= t < len(self.known) and not self.known[t] and i not in self.masked}
        self.seen += len(tokens)
        if fresh:
            for token in fresh:
                self.known[token] = 1
                bisect.insort(self.added, token)
            self.ids = torch.tensor(self.added, dtype=torch.long, device=device)
        return self.ids

    def proposable(self, token: int) -> bool:
        return 0 <= token < len(self.known) and bool(self.known[token])


def _linear_rows(linear, x: torch.Tensor, *args) -> torch.Tensor:
    """`linear(x, *args)` over x's rows as one 2-D matrix, reshaped back. A 3-D slice such as `[:, 1:]` of a block
    keeps its parent's stride in the size-1 batch dimension, so torch's matmul skips its fold into one mm
    (pytorch/pytorch#186148) and takes bmm, which is slow for bf16 on CPUs (#151934): 8 ms instead of 0.7 for
    SmolLM2's 7 x 8,192 draft head."""
    out = linear(x.reshape(-1, x.shape[-1]), *args)
    return out.view(*x.shape[:-1], out.shape[-1])


def _version(tensor: torch.Tensor):
    """The tensor's in-place version counter, for cache keys; None for an inference tensor (made or moved under
    `torch.inference_mode()`), which has none and cannot be modified in place outside that mode anyway."""
    return None if tensor.is_inference() else tensor._version
