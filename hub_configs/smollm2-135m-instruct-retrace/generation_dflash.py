"""Candidate generator for DFlash (+ReTrace) drafters (`dispatch_dflash` makes `generate(assistant_model=drafter)`
run it).

Part of the Hub payload: imports only torch, transformers and sibling modules.

transformers' `_assisted_decoding` owns verification (greedy match or speculative sampling) and cache
cropping; this generator only proposes. Per round, with the anchor (last committed token) at position p:
1. context: target features of the positions the last verification forward committed (the whole
   prompt after prefill); the drafter cache keeps keys/values of committed positions only;
2. one drafter forward on `[anchor, MASK x K]` at positions p..p+K gives K proposals, capped to the
   remaining budget (with `lookup_threshold`, the slots from the first unsure one are the context's own
   continuation, `lookup_dflash`), cut after the first EOS and before the first token at which another stopping
   criterion (stop strings, a custom one) would fire;
3. the logits the proposals were drawn from (after logits processors) go back for exact sampling;
4. KVShot (`context="kv"|"hybrid"`): the target's own cache, which transformers has just cropped to the committed
   positions before the anchor, is handed to the drafter as views (no extra target work);
5. ReTrace: the drafter states m and the target's verification states u of the rejected suffix are
   shifted by a + 1 (a accepted) into the next block's slots.
"""

import sys
import warnings
from dataclasses import dataclass, field

import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

from .kv_dflash import read_target_kv
from .lookup_dflash import ContextLookup
from .vocab_dflash import ContextVocabulary

SUPPORTED_TRANSFORMERS = ("5.15.0", "5.25.0")  # [floor, first untested release)


def _version_tuple(version: str) -> tuple:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_transformers_version(version: str = transformers.__version__) -> None:
    """Raises below the floor, warns above the tested range."""
    floor, ceiling = (_version_tuple(v) for v in SUPPORTED_TRANSFORMERS)
    current = _version_tuple(version)
    if current < floor:
        raise ImportError(
            f"dflash-retrace needs transformers >= {SUPPORTED_TRANSFORMERS[0]} (found {version}): it plugs into the "
            f"candidate-generator protocol of that release. Run: pip install 'transformers>={SUPPORTED_TRANSFORMERS[0]},"
            f"<{SUPPORTED_TRANSFORMERS[1]}'"
        )
    if current >= ceiling:
        warnings.warn(
            f"dflash-retrace was tested with transformers < {SUPPORTED_TRANSFORMERS[1]}; found {version}. "
            "Greedy output is still checked by transformers' own verification, but report problems.",
            stacklevel=2,
        )


check_transformers_version()
# Index lists for `output_hidden_states` (only the layers asked for are kept) exist from 5.23.
_HIDDEN_STATE_INDEX_LISTS = _version_tuple(transformers.__version__) >= (5, 23, 0)


@dataclass
class DFlashStats:
    """What happened in the last `generate` call, one entry per round (a drafter call and the verify after it).

    acceptance_lengths: tokens committed by the round, bonus included, after EOS/budget cropping (1..B).
        A round is one drafter call and the target forward after it; a round with no proposal (its first one was
        cut: unsure under `proposal_threshold`, or a stopping criterion would fire on it) commits 1.
    num_proposals: proposals verified in the round (K, or fewer when cut by the budget, an EOS, a stopping criterion,
        `max_proposals` or `proposal_threshold`).
    conditioned_slots: block slots that received ReTrace memory (0 for plain DFlash).
    drafts: the proposed token ids.
    draft_vocab_added: context tokens this call added to the drafter's draft vocabulary (`draft_vocab_context`).
    lookup_proposals: proposals of the round that came from the context lookup (`lookup_threshold`; 0 without it).
    """

    block_size: int = 0
    acceptance_lengths: list = field(default_factory=list)
    num_proposals: list = field(default_factory=list)
    conditioned_slots: list = field(default_factory=list)
    drafts: list = field(default_factory=list)
    draft_vocab_added: int = 0
    lookup_proposals: list = field(default_factory=list)

    @property
    def num_rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance_length(self) -> float | None:
        """τ: mean tokens per round (per target forward after a drafter call, bonus included); None with no rounds.

        The first new token comes from the prefill (the target runs alone: no features yet), and a round needs
        room for a proposal and the bonus, so `max_new_tokens` 1 or 2 give no rounds.
        """
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else None

    def __repr__(self) -> str:
        tau = self.mean_acceptance_length
        return (
            f"DFlashStats(rounds={self.num_rounds}, tau={'None (no rounds)' if tau is None else f'{tau:.3f}'}, "
            f"acceptance_lengths={self.acceptance_lengths})"
        )


@dataclass
class ReTraceMemory:
    """Memory of the previous round, aligned to the query stream of the next drafter call.

    drafter_states (b, q, H): m, the drafter's final normed state that produced the old proposal.
    target_states (b, q, H): u, the target's final-norm state that scored it.
    valid (b, q) bool: False where a slot has no source (anchors, slots past the old block).
    """

    drafter_states: torch.Tensor
    target_states: torch.Tensor
    valid: torch.Tensor

    @property
    def num_conditioned(self) -> int:
        return int(self.valid.sum())


class DFlashContextCache:
    """Per-layer keys/values of committed context positions (plus, during a call, the block).

    Minimal stand-in for a transformers `Cache`: `update` appends and returns everything, `crop`
    keeps the first `length` positions. The drafter also accepts a transformers `Cache`.
    """

    def __init__(self):
        self.keys: list = []
        self.values: list = []

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int) -> tuple:
        if layer_idx == len(self.keys):
            self.keys.append(key)
            self.values.append(value)
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], key], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], value], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def crop(self, length: int) -> None:
        self.keys = [k[:, :, :length] for k in self.keys]
        self.values = [v[:, :, :length] for v in self.values]


def _unwrap(model):
    """The DFlash drafter inside `model` (itself, or the base model of a PeftModel), else None."""
    if model is None:
        return None
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    return base if getattr(base, "_is_dflash_drafter", False) else None


class DFlashCandidateGenerator(CandidateGenerator):
    """transformers candidate generator (`requires_model_outputs` protocol) for DFlash drafters."""

    requires_model_outputs = True

    def __init__(self, drafter, target, generation_config, logits_processor=None, model_kwargs=None,
                 stopping_criteria=None):
        self.drafter = _unwrap(drafter)
        if self.drafter is None:
            raise TypeError(f"{type(drafter).__name__} is not a DFlash drafter.")
        self.drafter.check_target(target)
        config = self.drafter.config
        self.block_size = config.block_size
        self.mask_token_id = config.mask_token_id
        self.max_proposals, self.proposal_threshold, self.lookup_threshold = _round_limits(config)
        self.layer_ids = list(config.feature_layer_ids)  # target_layer_ids, then any fusion layers
        self.num_target_layers = target.config.get_text_config().num_hidden_layers
        self.use_retrace = self.drafter.retrace is not None
        self.context_mode = getattr(config, "context", "hidden")
        self.input_embeddings = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        if self.lm_head is None:
            raise ValueError(f"{type(target).__name__} has no output embeddings (LM head); DFlash drafts through it.")
        self.max_length = generation_config.max_length
        model_kwargs = model_kwargs or {}
        target_cache = _check_call_inputs(model_kwargs)
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None and len(logits_processor) else None
        self.proposal_policy = config.proposal_policy if self.do_sample else "argmax"
        eos = getattr(generation_config, "_eos_token_tensor", None)
        self.eos_ids = set(eos.view(-1).tolist()) if eos is not None else set()
        self.stopping_criteria = [
            c for c in (stopping_criteria or []) if not _handled_by_draft_cuts(c, self.max_length, self.eos_ids)
        ]
        if self.proposal_policy == "sample" and any(type(c) is not MaxTimeCriteria for c in self.stopping_criteria):
            # A draft cut before the proposal at which a criterion fires depends on that sampled proposal itself,
            # so the verified proposals would no longer be draws of the q handed to transformers (the output would
            # drift from p). Point-mass proposals make the cut a function of the prefix: exact again.
            warnings.warn(
                "proposal_policy='sample' with stop strings or custom stopping criteria would bias sampling (the "
                "draft is cut where a criterion fires, which depends on the sampled proposal): this call drafts "
                "with proposal_policy='argmax' instead, which stays exact. Drop the stopping criteria to sample "
                "proposals.", UserWarning, stacklevel=2)
            self.proposal_policy = "argmax"

        wanted = [i + 1 for i in self.layer_ids] + ([self.num_target_layers] if self.use_retrace else [])
        user_wants_all = bool(generation_config.output_hidden_states)
        self.model_kwargs_overrides = {
            "output_hidden_states": sorted(set(wanted)) if _HIDDEN_STATE_INDEX_LISTS and not user_wants_all else True
        }
        mask = model_kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all()) and not _mask_needed(
                target, generation_config, target_cache):
            # One unpadded sequence: the all-ones mask adds nothing to the causal one the target builds from positions,
            # but merging it costs every verify forward a mask construction (transformers >= 5.24 drops it itself).
            self.model_kwargs_overrides["attention_mask"] = None
        # Greedy without logits processors: transformers never reads the proposal distribution, so the drafter's
        # argmax is taken over its own head (draft vocabulary or not) and no full-vocabulary logits are built.
        self.greedy_without_logits = not self.do_sample and self.logits_processor is None

        param = next(self.drafter.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = DFlashContextCache()
        self.context_length = 0  # positions whose features are in the drafter cache (= committed - 1)
        self.round_open = False
        self.memory_source = None  # (m (1, K', H), K') of the last round, when it may feed the next one
        self.stats = DFlashStats(block_size=self.block_size)
        self.drafter.last_stats = self.stats
        self.context_vocab = None  # draft_vocab_context: the context's tokens join the draft vocabulary
        if getattr(config, "draft_vocab_context", False) and self.drafter.draft_to_target is not None:
            self.context_vocab = ContextVocabulary(self.drafter.draft_to_target, self.lm_head.weight.shape[0], mask)
        self.lookup = ContextLookup() if self.lookup_threshold > 0 else None  # lookup_dflash
        self.context_read = 0  # positions of input_ids the context vocabulary and the lookup have read
        self.splice_at = None  # the slot of the round's first lookup proposal, or None

    # -------------------------------------------------------------------------------- protocol
    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False,
                       n_last_matches=0, **kwargs):
        if is_first_iteration:  # the target prefills alone and gives the prompt's features
            return input_ids, None
        seq_len = input_ids.shape[1]
        remaining = self.max_length - seq_len  # tokens still allowed, the next bonus included
        if remaining <= 1:  # no room for a proposal: the target takes one plain step
            self.memory_source = None
            return input_ids, None
        if model_outputs is None or getattr(model_outputs, "hidden_states", None) is None:
            raise RuntimeError(
                "The target forward returned no hidden states, so DFlash has no context features. The target's "
                "forward must honour `output_hidden_states` (all transformers causal LMs do)."
            )
        hidden_states = model_outputs.hidden_states
        num_new = seq_len - 1 - self.context_length  # committed positions not yet in the drafter cache
        forward_length = hidden_states[self.layer_ids[0] + 1].shape[1]
        if not 1 <= num_new <= forward_length:
            raise RuntimeError(
                f"DFlash context is misaligned: {num_new} newly committed positions but the last target forward "
                f"covered {forward_length}. The target forward did not cover the positions transformers' assisted "
                "loop committed (a custom forward or cache that skips positions?); please report this with the "
                "target model class."
            )
        features = self.drafter.context_features(hidden_states, num_new)
        block_len = min(self.block_size, remaining + 1)  # the reference loop's block near the budget
        budget = min(self.block_size - 1, remaining - 1)  # every proposal + bonus fits the budget
        num_proposals = min(budget, self.max_proposals)
        memory, conditioned = (
            self._memory(int(n_last_matches), hidden_states, block_len) if self.use_retrace else (None, 0)
        )
        block_ids = torch.full((1, block_len), self.mask_token_id, dtype=torch.long, device=input_ids.device)
        block_ids[:, 0] = input_ids[0, -1]
        positions = torch.arange(self.context_length, seq_len - 1 + block_len, device=self.device)[None]
        noise = self.drafter.embed_block(self.input_embeddings, block_ids).to(self.device, self.dtype)
        kv = {}
        if self.context_mode != "hidden":  # the target cache holds exactly positions 0..seq_len-2 here
            kv["target_kv"] = read_target_kv(_target_cache(model_kwargs), self.drafter.config.kv_layer_ids,
                                             seq_len - 1, self.device, self.dtype)
        out = self.drafter(
            noise_embeds=noise,
            context_hidden_states=features.to(self.device, self.dtype),
            position_ids=positions,
            cache=None if self.context_mode == "kv" else self.cache,  # "kv": the target's cache is the context
            retrace_memory=memory,
            **kv,
        )
        self.context_length = seq_len - 1
        self.cache.crop(self.context_length)  # the block's keys/values never stay

        states = out.last_hidden_state[:, 1 : 1 + num_proposals]  # (1, K', H) slots 1..K'
        extra = self._read_context(input_ids)
        if self.greedy_without_logits:
            drafts, confidence = self.drafter.greedy_proposals(
                states, self.lm_head, self.proposal_threshold > 0 or self.lookup is not None, extra_ids=extra)
            drafts, logits = drafts.to(input_ids.device), None
        else:
            drafts, logits, confidence = self._proposals_with_logits(input_ids, states, extra)
        self.splice_at, draft_list = None, None
        if self.lookup is not None:  # the lookup reads the drafts to the host itself: its one sync of the round
            drafts, logits, draft_list = self._splice_lookup(drafts, logits, confidence)
        cut = self._confident_prefix(confidence) if confidence is not None and self.lookup is None else drafts.shape[1]
        if draft_list is None:  # the round's host sync (one more under proposal_threshold)
            draft_list = drafts[0, :cut].tolist()
        if self.eos_ids:  # nothing after an EOS can be committed; transformers ends on an accepted EOS
            cut = next((k + 1 for k, token in enumerate(draft_list) if token in self.eos_ids), cut)
        if self.stopping_criteria:
            cut = self._cut_before_stop(input_ids, drafts, cut)
        draft_list, drafts, states = draft_list[:cut], drafts[:, :cut], states[:, :cut]
        logits = None if logits is None else logits[:, :cut]
        if cut == 0:  # the first proposal would end generation, or is unsure: the target takes one plain step
            self.memory_source = None
            self._open_round(0, conditioned, [])  # a drafter call with nothing to verify: it commits one token
            return input_ids, None

        capped = budget < self.block_size - 1  # near the budget's end the memory stops, as in the reference
        self.memory_source = None if capped or not self.use_retrace else (states, drafts.shape[1])
        self._open_round(drafts.shape[1], conditioned, draft_list)
        return torch.cat([input_ids, drafts], dim=-1), logits

    def _open_round(self, num_proposals, conditioned, draft_list):
        self.stats.lookup_proposals.append(0 if self.splice_at is None else max(0, num_proposals - self.splice_at))
        self.stats.num_proposals.append(num_proposals)
        self.stats.conditioned_slots.append(conditioned)
        self.stats.drafts.append(draft_list)
        self.round_open = True

    def _confident_prefix(self, confidence) -> int:
        """Proposals to keep under `proposal_threshold`, given each proposal's drafter probability (K',): those before
        the first slot below the threshold (0 when slot 1 is already unsure: the round is then a plain target step)."""
        low = (confidence < self.proposal_threshold).nonzero()
        return int(low[0]) if len(low) else confidence.shape[0]

    def _splice_lookup(self, drafts, logits, confidence):
        """(drafts, logits, the drafts as a list) with the slots from the first one whose drafter top probability
        (`confidence`, (K',)) is below `lookup_threshold` replaced by the context lookup's continuation, where it has
        one (`lookup_dflash`). A replaced slot's q is a point mass on its proposal: the proposal is a function of the
        context and the proposals before it, and the slot was chosen from the drafter's distributions alone."""
        count = drafts.shape[1]
        unsure = (confidence < self.lookup_threshold).to(drafts.device, drafts.dtype)
        row = torch.cat([drafts[0], unsure]).tolist()  # one host read: the proposals and which slots are unsure
        proposals = row[:count]
        at = next((k for k, flag in enumerate(row[count:]) if flag), None)
        copied = [] if at is None else self.lookup.continuation(proposals[:at], count - at)
        if not copied:
            return drafts, logits, proposals
        self.splice_at = at
        tail = torch.tensor([copied], dtype=drafts.dtype, device=drafts.device)
        drafts = torch.cat([drafts[:, :at], tail], dim=-1)
        if logits is not None:
            point = torch.full((1, len(copied), logits.shape[-1]), float("-inf"), dtype=logits.dtype,
                               device=logits.device).scatter_(-1, tail[..., None].to(logits.device), 0.0)
            logits = torch.cat([logits[:, :at], point], dim=1)
        return drafts, logits, proposals[:at] + copied

    def _cut_before_stop(self, input_ids, drafts, cut):
        """Proposals to keep so that no stopping criterion fires before the last token a round commits.

        transformers appends accepted proposals and the bonus, then asks the criteria about the whole sequence
        once; a criterion that looks at the sequence's end (stop strings, most custom ones) misses a stop
        inside the block. Cutting the draft before the first proposal at which a criterion fires leaves that
        token to the bonus: a round ends exactly where plain decoding would stop, or earlier.
        """
        for k in range(cut):
            prefix = torch.cat([input_ids, drafts[:, : k + 1]], dim=-1)
            if any(bool(criterion(prefix, None).any()) for criterion in self.stopping_criteria):
                return k
        return cut

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self.round_open:
            self.stats.acceptance_lengths.append(int(num_matches) + 1)
            self.round_open = False

    def proposable(self, token: int) -> bool:
        """Whether the drafter could propose `token` in the round drafted last (its draft vocabulary, grown by the
        context read up to that round)."""
        if self.context_vocab is not None:
            return self.context_vocab.proposable(token)
        vocab = self.drafter.draft_to_target
        return vocab is None or bool((vocab == token).any())

    # ---------------------------------------------------------------------------------- pieces
    def _read_context(self, input_ids):
        """Reads the tokens committed since the last round to the host once, for the context vocabulary and the
        lookup; returns the context's token ids outside the draft vocabulary (ascending), or None (none, or not asked
        for)."""
        if self.context_vocab is None and self.lookup is None:
            return None
        new = input_ids[0, self.context_read:].tolist()
        self.context_read = input_ids.shape[1]
        if self.lookup is not None:
            self.lookup.extend(new)
        if self.context_vocab is None:
            return None
        extra = self.context_vocab.extend(new, input_ids.device)
        self.stats.draft_vocab_added = len(self.context_vocab.added)
        return extra

    def _proposals_with_logits(self, input_ids, states, extra=None):
        """(drafts, the q transformers verifies them against, each draft's drafter probability or None)."""
        logits = self.drafter.compute_logits(states, self.lm_head, extra).to(input_ids.device, torch.float32)
        wanted = self.proposal_threshold > 0 or self.lookup is not None
        probs = logits.softmax(dim=-1) if wanted else None  # before processors touch it
        drafts, logits = self._propose(input_ids, logits)
        if probs is None:
            return drafts, logits, None
        if self.lookup is not None:  # the lookup's slot follows the distributions, never a sampled proposal
            return drafts, logits, probs[0].max(dim=-1).values
        confidence = probs[0].gather(-1, drafts[0, :, None].to(probs.device))[:, 0]
        if self.proposal_policy == "sample":
            # The threshold cuts at the first sampled proposal below it, so a verified proposal was drawn from q
            # restricted to the tokens at or above the threshold: hand transformers that q (renormalised by its
            # softmax), and rejection sampling still returns p exactly.
            logits = logits.masked_fill(probs.to(logits.device) < self.proposal_threshold, float("-inf"))
        return drafts, logits, confidence

    def _propose(self, input_ids, logits):
        """Proposals and the distribution q they were drawn from, after the same processors the target uses."""
        if self.logits_processor is not None:
            prefix = input_ids
            for k in range(logits.shape[1]):  # processors see the prefix each slot would extend
                logits[:, k] = self.logits_processor(prefix, logits[:, k])
                prefix = torch.cat([prefix, self._draw(logits[:, k : k + 1])], dim=-1)
            drafts = prefix[:, input_ids.shape[1] :]
        else:
            drafts = self._draw(logits)
        if self.do_sample and self.proposal_policy == "argmax":
            # q is a point mass on the argmax: rejection sampling accepts it with p(x) and otherwise
            # resamples from p without x, so the output still follows p exactly.
            logits = torch.full_like(logits, float("-inf")).scatter_(-1, drafts[..., None], 0.0)
        return drafts, logits

    def _draw(self, logits):
        if self.proposal_policy == "sample":
            probs = torch.softmax(logits, dim=-1)  # (1, k, V)
            return torch.multinomial(probs[0], num_samples=1).T
        return logits.argmax(dim=-1)

    def _memory(self, accepted, hidden_states, block_len=None):
        """Aligns last round's memory to this block: new slot i takes old slot i + a + 1 if it exists.

        Returns (ReTraceMemory over `block_len` slots (default: block_size) or None, conditioned slots).
        """
        block_len = block_len or self.block_size
        source, self.memory_source = self.memory_source, None
        if source is None:
            return None, 0
        drafter_states, num_old = source
        if accepted >= num_old - 1:  # everything (or all but the last) accepted: no rejected suffix left
            return None, 0
        target_final = hidden_states[self.num_target_layers]  # final-norm states; index j-1 scored old slot j
        slots = torch.arange(block_len, device=self.device)
        src = slots + accepted  # old slot index (0-based) feeding new slot i: (i + a + 1) - 1
        valid = (slots >= 1) & (src <= num_old - 1)
        index = src.clamp(max=num_old - 1)
        m = drafter_states[:, index]
        u = target_final[:, index.to(target_final.device)].to(self.device, self.dtype)
        conditioned = min(num_old - 1 - accepted, block_len - 1)
        return ReTraceMemory(drafter_states=m, target_states=u, valid=valid[None]), conditioned


def _round_limits(config) -> tuple:
    """(max_proposals, proposal_threshold, lookup_threshold) of a drafter config, after the checks across them."""
    block_size = config.block_size
    max_proposals = getattr(config, "max_proposals", None) or block_size - 1
    if max_proposals > block_size - 1:
        raise ValueError(
            f"max_proposals={max_proposals} exceeds the block's {block_size - 1} proposal slots (block_size "
            f"{block_size}): set drafter.config.max_proposals to 1..{block_size - 1}, or None for all of them."
        )
    proposal_threshold = float(getattr(config, "proposal_threshold", 0.0) or 0.0)
    lookup_threshold = float(getattr(config, "lookup_threshold", 0.0) or 0.0)
    if lookup_threshold > 0 and proposal_threshold > 0:
        raise ValueError(
            f"lookup_threshold={lookup_threshold} and proposal_threshold={proposal_threshold} both act at the "
            "drafter's first unsure slot (one copies the context from there, the other stops proposing): set one "
            "of them to 0."
        )
    return max_proposals, proposal_threshold, lookup_threshold


def _target_cache(model_kwargs):
    """The target's cache in generate()'s model kwargs (`past_key_values`, renamed `cache` in 5.24)."""
    model_kwargs = model_kwargs or {}
    return model_kwargs.get("cache", model_kwargs.get("past_key_values"))


def _mask_needed(target, generation_config, cache) -> bool:
    """True where an all-ones mask still carries information: flash-attention kernels over a static cache read its
    length to cut off the cache's unfilled slots (transformers keeps the mask there for the same reason)."""
    flash = "flash" in str(getattr(target.config, "_attn_implementation", None) or "")
    static = getattr(generation_config, "cache_implementation", None) == "static" or (
        cache is not None and not isinstance(cache, DynamicCache))
    return flash and static


def _check_call_inputs(model_kwargs):
    """The target's cache of this generate() call (None if none yet), after refusing inputs DFlash cannot align."""
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError(
            "generate(inputs_embeds=...) with a DFlash drafter is not supported: the drafter reads the target's "
            "states of every prompt token, which it aligns by input_ids. Pass input_ids instead."
        )
    target_cache = _target_cache(model_kwargs)
    if target_cache is not None and target_cache.get_seq_length() > 0:
        # transformers' assisted loop re-feeds the whole prompt on top of a pre-filled cache (5.10-5.24),
        # which silently corrupts the output with any assistant.
        raise RuntimeError(
            f"generate() was given a pre-filled target cache ({target_cache.get_seq_length()} positions): "
            "transformers' assisted decoding re-feeds the prompt on top of it and the output would be wrong. "
            "Call generate() without `cache=`/`past_key_values=` when using a DFlash drafter."
        )
    return target_cache


def _handled_by_draft_cuts(criterion, max_length, eos_ids) -> bool:
    """True for the criteria that the budget cap and the EOS cut already make exact (skips their per-prefix check)."""
    if type(criterion) is MaxLengthCriteria:
        return criterion.max_length >= max_length
    if type(criterion) is EosTokenCriteria:
        return set(criterion.eos_token_id.view(-1).tolist()) <= eos_ids
    return False


_MOVED_TO_DISPATCH = {"install_dispatch", "uninstall_dispatch", "no_dispatch", "dispatch_enabled", "CriteriaAfterPrompt"}


def __getattr__(name):  # the dispatch lived here before `dispatch_dflash`: old imports keep working, with a warning
    if name not in _MOVED_TO_DISPATCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"`generation_dflash.{name}` moved to `dispatch_dflash.{name}` (or import it from the package).",
                  FutureWarning, stacklevel=2)
    # Imported here (it imports this module), in the one relative form trust_remote_code resolves.
    from .dispatch_dflash import install_dispatch

    return getattr(sys.modules[install_dispatch.__module__], name)


__all__ = [
    "DFlashCandidateGenerator",
    "DFlashContextCache",
    "DFlashStats",
    "ReTraceMemory",
    "check_transformers_version",
]
