"""ReTrace-stage rollouts: real draft-verify rounds with the project's own generator, recorded for replay.

Each training sequence is rolled out once with the starting drafter (greedy, or sampled at `temperature` for a
seeded share of the rows, so that training also meets the memory that sampling generation gives); every round's anchor position and
the ReTrace memory that entered the drafter are kept (`recording_rounds`), one file per sequence under
`out_dir/rollouts` (reused on resume). Training then replays each round as a block anchored there with that
memory (see `data.collate`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..generation_dflash import DFlashCandidateGenerator, ReTraceMemory
from .objective import drafter_core

__all__ = ["RolloutStore", "recording_rounds", "rollouts"]


class _RecordingGenerator(DFlashCandidateGenerator):
    """The library's candidate generator, also appending (anchor position, memory on the CPU or None) per round."""

    def __init__(self, *args, rounds: list, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds, self._entered = rounds, None

    def _memory(self, *args, **kwargs):
        memory, conditioned = super()._memory(*args, **kwargs)
        self._entered = memory
        return memory, conditioned

    def get_candidates(self, input_ids, *args, **kwargs):
        self._entered = None
        candidates, logits = super().get_candidates(input_ids, *args, **kwargs)
        if candidates.shape[1] > input_ids.shape[1]:  # a round with proposals (else the target takes a plain step)
            memory = self._entered
            if memory is not None:
                memory = ReTraceMemory(*(t.detach().cpu() for t in
                                         (memory.drafter_states, memory.target_states, memory.valid)))
            self.rounds.append((input_ids.shape[1] - 1, memory))
        return candidates, logits


@contextlib.contextmanager
def recording_rounds(drafter):
    """Inside the block, `generate(assistant_model=drafter)` appends (anchor position, ReTraceMemory that entered
    the drafter or None) per round to the yielded list. `drafter` is the library's `DFlashDrafter` (unwrapped)."""
    rounds = []

    def make_candidate_generator(target, generation_config, logits_processor, model_kwargs, stopping_criteria=None):
        return _RecordingGenerator(drafter, target, generation_config, logits_processor, model_kwargs,
                                   stopping_criteria=stopping_criteria, rounds=rounds)

    drafter.make_candidate_generator = make_candidate_generator  # the dispatch asks the drafter for its generator
    try:
        yield rounds
    finally:
        del drafter.make_candidate_generator


def _row_seed(seed, i):
    """Row i's own seed: both its greedy-or-sampled draw and its sample come from it."""
    return seed * 1_000_003 + i


def _sampling(i, temperature, sampled_share, seed):
    """generate() options of row i's rollout: greedy, or sampled at `temperature` for the rows a per-row draw from
    `seed` puts inside `sampled_share`. The draw is row i's own, so resuming or sharding over processes picks the
    same rows."""
    if temperature <= 0:
        return {"do_sample": False}
    draw = torch.rand((), generator=torch.Generator().manual_seed(_row_seed(seed, i))).item()
    if draw >= sampled_share:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": float(temperature), "top_p": 1.0, "top_k": 0}  # the full distribution


@torch.no_grad()
def rollouts(model, target, examples, indices, out_dir, store_dtype, progress, temperature=0.0, sampled_share=1.0,
             seed=0):
    """Draft-verify rollouts of `examples[i]` for i in indices, one file each under out_dir/rollouts: greedy, or
    sampled at `temperature` (full distribution) for a `sampled_share` of the rows, seeded per row.

    A file holds the committed sequence (prompt + the target's continuation), every round's anchor and,
    for rounds that received memory, that memory (slots aligned to the block, padded to B, slot 0 invalid),
    and the temperature it was rolled out at (0: greedy). Existing files are kept (resume). Returns the
    acceptance lengths of all these rollouts' rounds.
    """
    core = drafter_core(model)
    B = core.config.block_size
    root = Path(out_dir) / "rollouts"
    root.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    lengths = []
    with recording_rounds(core) as rounds:
        for i in tqdm(indices, desc="rollouts", unit="seq", disable=not progress):
            path = root / f"{i:07d}.pt"
            if path.exists():  # rolled out before an interruption
                lengths += torch.load(path, weights_only=True)["acceptance_lengths"]
                continue
            ex = examples[i]
            rounds.clear()
            prompt = ex.input_ids[: ex.prompt_length][None].to(target.device)
            new_tokens = int(ex.input_ids.numel() - ex.prompt_length)
            sampling = _sampling(i, temperature, sampled_share, seed)
            with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else []):
                torch.manual_seed(_row_seed(seed, i))  # the row's own sample, whatever ran before it
                out = target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=model,
                                      max_new_tokens=new_tokens, **sampling)
            stats = core.last_stats
            lengths += stats.acceptance_lengths
            ids = out[0].cpu()
            mask = torch.zeros(ids.numel(), dtype=torch.bool)
            mask[ex.prompt_length :] = True
            anchors, memory_index, ms, us, valids = [], [], [], [], []
            for p, mem in rounds:
                if p < 1 or p + 1 >= ids.numel():  # no context or no label inside the sequence
                    continue
                anchors.append(p)
                if mem is None or not bool(mem.valid.any()):
                    memory_index.append(-1)
                    continue
                memory_index.append(len(ms))
                L = mem.valid.shape[1]
                m = torch.zeros(B, mem.drafter_states.shape[-1], dtype=store_dtype)
                u = torch.zeros_like(m)
                v = torch.zeros(B, dtype=torch.bool)
                m[:L], u[:L], v[:L] = mem.drafter_states[0], mem.target_states[0], mem.valid[0]
                ms.append(m), us.append(u), valids.append(v)
            hidden = core.config.hidden_size
            partial = path.with_suffix(".partial")  # renamed when complete: an interrupted write leaves no .pt
            torch.save({
                "input_ids": ids, "loss_mask": mask, "anchors": torch.tensor(anchors, dtype=torch.long),
                "memory_index": torch.tensor(memory_index, dtype=torch.long),
                "m": torch.stack(ms) if ms else torch.zeros(0, B, hidden, dtype=store_dtype),
                "u": torch.stack(us) if us else torch.zeros(0, B, hidden, dtype=store_dtype),
                "valid": torch.stack(valids) if valids else torch.zeros(0, B, dtype=torch.bool),
                "acceptance_lengths": list(stats.acceptance_lengths),
                "temperature": float(sampling.get("temperature", 0.0)),
            }, partial)
            partial.replace(path)
    model.train(was_training)
    return lengths


class RolloutStore:
    """Lazily loaded rollout files, indexable like the example list."""

    def __init__(self, out_dir, indices):
        self.root = Path(out_dir) / "rollouts"
        self.indices = list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, k):
        return torch.load(self.root / f"{self.indices[k]:07d}.pt", weights_only=True)
