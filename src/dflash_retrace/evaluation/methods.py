"""The generate() calls `bench` compares, each returning a `Generation` (new ids and, if speculative, its rounds).

- `plain`: `target.generate()` alone (the speedup's denominator);
- `speculative`: `target.generate(assistant_model=drafter)` (this library's candidate generator), and one
  `speculative:<label>` per compared drafter;
- with baselines: `zlab_reference`, z-lab's own loop `dflash.model.dflash_generate` on a
  `dflash.model.DFlashDraftModel` holding the same weights, and `transformers_builtin`,
  `generate(assistant_model=drafter, speculation_type="dflash")`.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import torch

from ..modeling_dflash import DFlashDrafter
from ..runtime import eos_token_ids, zlab_incompatibility

__all__ = ["BUILTIN", "Generation", "Methods", "PLAIN", "REFERENCE", "SPECULATIVE", "build_reference_drafter"]

PLAIN, SPECULATIVE, REFERENCE, BUILTIN = "plain", "speculative", "zlab_reference", "transformers_builtin"


def build_reference_drafter(drafter: DFlashDrafter):
    """z-lab's `dflash.model.DFlashDraftModel` holding `drafter`'s weights (the checkpoint keys are the same).

    Config in z-lab's layout: a Qwen3Config plus `dflash_config={mask_token_id, target_layer_ids}`,
    `block_size` and `num_target_layers`. ReTrace weights, if any, are left out: the reference is plain DFlash.
    """
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    c = drafter.config
    dflash_config = {"mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)}
    for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        if getattr(c, name) != default:
            dflash_config[name] = getattr(c, name)
    config = Qwen3Config(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        max_position_embeddings=c.max_position_embeddings, attention_bias=c.attention_bias, hidden_act=c.hidden_act,
        vocab_size=c.vocab_size, tie_word_embeddings=False,
    )
    config.architectures = ["DFlashDraftModel"]
    config.block_size = c.block_size
    config.num_target_layers = c.num_target_layers
    config.dflash_config = dflash_config
    param = drafter.fc.weight
    with torch.device(param.device):
        model = DFlashDraftModel(config)
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("retrace.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise RuntimeError(f"weights do not map onto z-lab's DFlashDraftModel: missing {missing}, unexpected {unexpected}")
    return model.to(dtype=param.dtype).eval()


@dataclass
class Generation:
    """One method on one turn: new token ids and, for speculative methods, its rounds."""

    new_ids: list
    acceptance_lengths: list | None = None
    num_proposals: list | None = None
    drafts: list | None = None  # our generator only: each round's proposals, and the slots given ReTrace memory
    conditioned_slots: list | None = None


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _counted_proposals(drafts: list, limit: int, stop_ids) -> int:
    """Proposals a baseline's round counts: at most `limit` (what the budget can commit), and none after the first
    stop id among them (nothing after an EOS can be committed), as this library's generator cuts its drafts."""
    limit = max(0, min(limit, len(drafts)))
    return next((k + 1 for k, token in enumerate(drafts[:limit]) if token in stop_ids), limit)


def _budget_rounds(produced: list, drafts: list, max_new_tokens: int, block_size: int, stop_ids) -> tuple:
    """(acceptance lengths, proposals) in this module's definition, from z-lab's per-round `produced` counts and
    `drafts`, the proposals each round verified.

    z-lab's loop verifies a full block even when fewer tokens fit the budget (and then clips what it commits), and
    verifies the proposals after an EOS too; proposals that could never be committed are not counted (past the
    budget, or after the first id of `stop_ids`), and a round left with none is a plain step, as in this library's
    generator.
    """
    if len(drafts) != len(produced):
        raise RuntimeError(f"z-lab's loop reported {len(produced)} rounds but {len(drafts)} verified blocks were "
                           "recorded: its loop no longer calls the target once per round as this log assumes")
    lengths, counts, offset = [], [], 1  # the first new token comes from prefill
    for d, proposals in zip(produced, drafts):
        remaining = max_new_tokens - offset  # tokens still allowed, the bonus included
        k = min(block_size - 1, remaining - 1)
        if k >= 1:
            lengths.append(int(d))
            counts.append(_counted_proposals(proposals, k, stop_ids))
        offset += int(d)
    return lengths, counts


def _token_lists(blocks: list) -> list:
    """1-D id tensors -> lists, through one host copy (not one per round)."""
    if not blocks:
        return []
    flat = torch.cat([b.reshape(-1) for b in blocks]).tolist()
    out, start = [], 0
    for b in blocks:
        out.append(flat[start:start + b.numel()])
        start += b.numel()
    return out


class Methods:
    """The generate calls being compared; each returns a Generation for one turn's input ids."""

    def __init__(self, target, drafter, max_new_tokens: int, temperature: float, baselines: bool,
                 compare: dict | None = None):
        self.target, self.drafter = target, drafter
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.block_size = drafter.config.block_size
        self.stop_ids = eos_token_ids(target) or None
        self._stops = set(self.stop_ids or ())
        pad = target.generation_config.pad_token_id
        pad = pad if pad is not None else (self.stop_ids[0] if self.stop_ids else None)
        self.kwargs = {"do_sample": temperature > 0, "pad_token_id": pad}
        if temperature > 0:  # plain temperature sampling, as the reference loop (top_p=1, top_k=0)
            self.kwargs.update(temperature=temperature, top_p=1.0, top_k=0)
        self.available = {PLAIN: self.plain, SPECULATIVE: self.speculative}
        self.block_sizes = {SPECULATIVE: self.block_size}
        for label, other in (compare or {}).items():  # more drafters, each against the same plain run
            name = f"{SPECULATIVE}:{label}"
            self.available[name] = lambda ids, n, other=other: self.speculative(ids, n, other)
            self.block_sizes[name] = other.config.block_size
        self.skipped = {}
        self.reference = None
        if baselines:
            try:
                import dflash.model  # noqa: F401
            except ImportError as err:
                self.skipped[REFERENCE] = f"z-lab's `dflash` is not importable ({err}); pip install dflash==0.1.0"
            else:
                reason = zlab_incompatibility(drafter.config)
                if reason is not None:
                    self.skipped[REFERENCE] = reason
                    warnings.warn(f"bench --baselines: {REFERENCE} skipped: {reason}", stacklevel=2)
                else:
                    self.reference = build_reference_drafter(drafter)
                    self.available[REFERENCE] = self.zlab_reference
            self.available[BUILTIN] = self.transformers_builtin
            self.block_sizes[REFERENCE] = self.block_sizes[BUILTIN] = self.block_size

    def _generate(self, input_ids, max_new_tokens, **extra):
        out = self.target.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                   max_new_tokens=max_new_tokens, **self.kwargs, **extra)
        return out[0, input_ids.shape[1]:].tolist()

    def prefill(self, input_ids):
        return self._generate(input_ids, 1)

    def plain(self, input_ids, max_new_tokens):
        return Generation(self._generate(input_ids, max_new_tokens))

    def speculative(self, input_ids, max_new_tokens, drafter=None):
        drafter = self.drafter if drafter is None else drafter
        drafter.last_stats = None
        new_ids = self._generate(input_ids, max_new_tokens, assistant_model=drafter)
        stats = drafter.last_stats
        if stats is None:  # never report a plain run as speculative
            raise RuntimeError("generate(assistant_model=drafter) did not run the DFlash candidate generator "
                               "(drafter.last_stats was not set): is the dispatch disabled (no_dispatch)?")
        return Generation(new_ids, list(stats.acceptance_lengths), list(stats.num_proposals), list(stats.drafts),
                          list(stats.conditioned_slots))

    def zlab_reference(self, input_ids, max_new_tokens):
        from dflash.model import dflash_generate

        blocks = []  # every target call's ids: the prefill's, then each round's [anchor, proposals...]
        hook = self.target.register_forward_pre_hook(
            lambda module, args, kwargs: blocks.append(args[0] if args else kwargs["input_ids"]), with_kwargs=True)
        try:
            with _reference_clock(input_ids.device), warnings.catch_warnings():
                # z-lab 0.1.0 still passes `past_key_values=` to the target (renamed `cache=` in transformers 5.24)
                warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
                result = dflash_generate(self.reference, self.target, input_ids, max_new_tokens, self.stop_ids,
                                         temperature=self.temperature, return_stats=True)
        finally:
            hook.remove()
        drafts = _token_lists([block[0, 1:] for block in blocks[1:]])
        lengths, counts = _budget_rounds(result.acceptance_lengths, drafts, max_new_tokens, self.block_size,
                                         self._stops)
        return Generation(result.output_ids[0, input_ids.shape[1]:].tolist(), lengths, counts)

    def transformers_builtin(self, input_ids, max_new_tokens):
        log = []
        with _record_builtin_rounds(log):
            new_ids = self._generate(input_ids, max_new_tokens, assistant_model=self.drafter, speculation_type="dflash")
        lengths, counts = [], []
        drafts = _token_lists([proposals for *_, proposals in log])
        for (committed, _, remaining, _), proposals in zip(log, drafts):
            k = _counted_proposals(proposals, remaining - 1, self._stops)
            if k >= 1:
                lengths.append(committed)
                counts.append(k)
        return Generation(new_ids, lengths, counts)


@contextlib.contextmanager
def _reference_clock(device: torch.device):
    """z-lab's loop reads its clocks through `torch.cuda.synchronize()`; off CUDA use the plain clock."""
    import dflash.model as zlab

    if device.type == "cuda":
        yield
        return
    original = zlab._cuda_time
    zlab._cuda_time = time.perf_counter
    try:
        yield
    finally:
        zlab._cuda_time = original


@contextlib.contextmanager
def _record_builtin_rounds(log: list):
    """Logs (committed, proposals, remaining budget, the proposals' ids) per round of transformers' built-in DFlash
    generator."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator as Builtin

    pending = []  # the proposals of the round being verified

    def get_candidates(self, input_ids, *args, **kwargs):
        candidate_ids, candidate_logits = originals["get_candidates"](self, input_ids, *args, **kwargs)
        pending[:] = [candidate_ids[0, input_ids.shape[1]:]]
        return candidate_ids, candidate_logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        proposals = scores.shape[1] - 1  # scores cover the proposals and the bonus position
        if proposals > 0:
            if not pending or pending[0].numel() != proposals:
                raise RuntimeError("transformers' built-in DFlash round verified proposals its get_candidates did not "
                                   "return: the round log cannot tell which proposals it counts")
            committed = int(num_matches) + 1
            log.append((committed, proposals, self.main_model_max_length - (input_ids.shape[1] - committed),
                        pending.pop()))
        return originals["update_candidate_strategy"](self, input_ids, scores, num_matches)

    patches = {"get_candidates": get_candidates, "update_candidate_strategy": update_candidate_strategy}
    originals = {name: getattr(Builtin, name) for name in patches}
    had_own = {name: name in Builtin.__dict__ for name in patches}
    for name, patch in patches.items():
        setattr(Builtin, name, patch)
    try:
        yield
    finally:
        for name in patches:
            if had_own[name]:
                setattr(Builtin, name, originals[name])
            else:
                delattr(Builtin, name)
