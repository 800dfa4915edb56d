"""Acceptance metrics over round logs (τ: tokens committed per round, bonus included), pure functions with no torch.

A round is one drafter call and the target forward after it, as `generate(assistant_model=...)` records it
(`DFlashStats`); a round whose proposals were all cut (`proposal_threshold`, or a stopping criterion on the first)
counts, with 0 proposals and length 1. Per round we keep
- the acceptance length: tokens it committed, bonus included (1..B);
- the number of proposals it verified (0..K, K = B - 1; fewer near the token budget, at EOS, under `max_proposals`
  or `proposal_threshold`).

A run's log is one list of rounds per prompt: `acceptance_lengths[p][r]`, `num_proposals[p][r]`.
"""

from __future__ import annotations

import math
import random

from ..runtime import speedup_bound_fault  # shared with the demo (a command of its own)

__all__ = [
    "acceptance_histogram",
    "agreement",
    "check_rounds",
    "merge_suffix_matches",
    "paired_ratio_interval",
    "per_slot_acceptance",
    "rejected_suffix_matches",
    "speedup_bound_fault",
    "spread",
    "summarize_rounds",
    "tau_pooled",
    "tau_prompt_mean",
]


def check_rounds(acceptance_lengths: list, num_proposals: list, block_size: int) -> None:
    """Raises ValueError unless every round satisfies 0 <= proposals <= B-1 and 1 <= length <= proposals+1."""
    if len(acceptance_lengths) != len(num_proposals):
        raise ValueError(f"{len(acceptance_lengths)} prompts of acceptance lengths but {len(num_proposals)} of proposals")
    for p, (lengths, proposals) in enumerate(zip(acceptance_lengths, num_proposals)):
        if len(lengths) != len(proposals):
            raise ValueError(f"prompt {p}: {len(lengths)} acceptance lengths but {len(proposals)} proposal counts")
        for r, (length, k) in enumerate(zip(lengths, proposals)):
            if not 0 <= k <= block_size - 1:  # 0: a round whose proposals were all cut (a plain target step)
                raise ValueError(f"prompt {p} round {r}: {k} proposals, outside 0..{block_size - 1} (block_size {block_size})")
            if not 1 <= length <= k + 1:
                raise ValueError(f"prompt {p} round {r}: acceptance length {length} outside 1..{k + 1} ({k} proposals + bonus)")


def tau_pooled(acceptance_lengths: list) -> float | None:
    """τ as the mean over all rounds of all prompts (long answers weigh more); None with no rounds (as
    `DFlashStats.mean_acceptance_length`)."""
    rounds = [length for lengths in acceptance_lengths for length in lengths]
    return sum(rounds) / len(rounds) if rounds else None


def tau_prompt_mean(acceptance_lengths: list) -> float | None:
    """τ as the mean over prompts of each prompt's mean (each prompt weighs the same); prompts with
    no rounds are left out; None if none has any."""
    means = [sum(lengths) / len(lengths) for lengths in acceptance_lengths if lengths]
    return sum(means) / len(means) if means else None


def acceptance_histogram(acceptance_lengths: list, block_size: int) -> dict:
    """Counts and fractions of acceptance lengths 1..B over all rounds: `counts[i]` is length i + 1."""
    counts = [0] * block_size
    for lengths in acceptance_lengths:
        for length in lengths:
            if not 1 <= length <= block_size:
                raise ValueError(f"acceptance length {length} outside 1..{block_size}")
            counts[length - 1] += 1
    total = sum(counts)
    return {
        "lengths": list(range(1, block_size + 1)),
        "counts": counts,
        "fractions": [c / total if total else math.nan for c in counts],
    }


def per_slot_acceptance(acceptance_lengths: list, num_proposals: list, block_size: int) -> dict:
    """Per proposal slot k = 1..K: rounds that proposed slot k, rounds that accepted it, and the rate.

    Slot k is accepted when the round accepted at least k proposals (acceptance length >= k + 1). One exception,
    transformers' own accounting: a round that ends on an accepted EOS proposal commits that EOS as its bonus token,
    so the EOS slot counts as not accepted (at most one round per generation; τ, tokens per round, is unaffected).
    The rate is accepted / proposed (nan where no round proposed slot k), i.e. P(slot k accepted |
    slot k proposed): it includes the chance that an earlier slot was rejected.
    """
    check_rounds(acceptance_lengths, num_proposals, block_size)
    num_slots = block_size - 1
    proposed = [0] * num_slots
    accepted = [0] * num_slots
    for lengths, proposals in zip(acceptance_lengths, num_proposals):
        for length, k in zip(lengths, proposals):
            for slot in range(k):
                proposed[slot] += 1
            for slot in range(length - 1):
                accepted[slot] += 1
    return {
        "slots": list(range(1, num_slots + 1)),
        "proposed": proposed,
        "accepted": accepted,
        "rate": [a / p if p else math.nan for a, p in zip(accepted, proposed)],
    }


def summarize_rounds(acceptance_lengths: list, num_proposals: list, block_size: int) -> dict:
    """Everything the benchmark reports about acceptance, from one run's per-prompt round logs."""
    check_rounds(acceptance_lengths, num_proposals, block_size)
    return {
        "block_size": block_size,
        "num_rounds": sum(len(lengths) for lengths in acceptance_lengths),
        "tau_pooled": tau_pooled(acceptance_lengths),
        "tau_prompt_mean": tau_prompt_mean(acceptance_lengths),
        "histogram": acceptance_histogram(acceptance_lengths, block_size),
        "per_slot": per_slot_acceptance(acceptance_lengths, num_proposals, block_size),
    }


def agreement(reference: list, outputs: list) -> dict:
    """How closely `outputs[p]` (token ids) reproduce `reference[p]`, over the prompts given.

    exact_rate: fraction of prompts whose outputs are identical;
    prefix_rate: tokens before the first divergence, summed, over the longer output's tokens, summed
      (1.0 iff all identical; a token after a divergence never counts, since the contexts differ);
    first_divergence: per prompt, the index of the first differing token, or None if identical.
    """
    if len(reference) != len(outputs):
        raise ValueError(f"{len(reference)} reference outputs but {len(outputs)} outputs")
    firsts, common, total = [], 0, 0
    for ref, out in zip(reference, outputs):
        ref, out = list(ref), list(out)
        n = 0
        while n < min(len(ref), len(out)) and ref[n] == out[n]:
            n += 1
        identical = n == len(ref) == len(out)
        firsts.append(None if identical else n)
        common += n
        total += max(len(ref), len(out))
    return {
        "num_prompts": len(reference),
        "exact_rate": sum(f is None for f in firsts) / len(firsts) if firsts else math.nan,
        "prefix_rate": common / total if total else math.nan,
        "first_divergence": firsts,
    }


def spread(values: list) -> dict | None:
    """min / median / max of per-prompt figures (None without any)."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"min": values[0], "median": median, "max": values[-1], "n": len(values)}


def paired_ratio_interval(rows: list, reps: int = 2000, seed: int = 0) -> list | None:
    """95% paired-bootstrap interval over prompts of (Σa/Σb) / (Σc/Σd), from per-prompt rows (a, b, c, d).

    E.g. a round-time ratio: (our decode seconds, our rounds, their decode seconds, their rounds) per prompt; for a
    plain time ratio pass b = d = 1. Both methods keep the same resampled prompts; every row counts, as in the point
    estimate (a draw whose sums leave a zero denominator is skipped). None without rows or usable draws."""
    if not rows:
        return None
    rng = random.Random(seed)
    draws = []
    for _ in range(reps):
        sample = [rows[rng.randrange(len(rows))] for _ in rows]
        a, b, c, d = (sum(r[i] for r in sample) for i in range(4))
        if b and c and d:
            draws.append((a / b) / (c / d))
    if not draws:
        return None
    draws.sort()
    return [draws[int(0.025 * len(draws))], draws[int(0.975 * len(draws)) - 1]]


SUFFIX_SHIFTS = (-1, 0, 1)


def rejected_suffix_matches(new_ids: list, acceptance_lengths: list, drafts: list, first: int = 1) -> dict:
    """Where the rejected suffixes of one turn land: in every round that rejected a proposal, its later proposals
    (what ReTrace hands the next round as memory) against the tokens the target committed at the same positions
    (shift 0) and one position earlier or later (-1 / +1: the draft ran a token behind or ahead of the target).

    `new_ids`: the turn's new tokens; round r proposes from index `first + sum(acceptance_lengths[:r])` (`first`:
    tokens committed before the first round, the prefill's one). `drafts[r]`: round r's proposals. Only positions
    inside `new_ids` are compared, so a round cut by EOS or the budget counts no rejection.

    Returns {"rounds": rounds with a rejected suffix, "compared": {shift: n}, "matched": {shift: n}} (str keys).
    """
    if len(drafts) != len(acceptance_lengths):
        raise ValueError(f"{len(drafts)} rounds of drafts but {len(acceptance_lengths)} acceptance lengths")
    compared = {str(s): 0 for s in SUFFIX_SHIFTS}
    matched = dict(compared)
    rounds, start = 0, first
    for length, proposals in zip(acceptance_lengths, drafts):
        rejected = start + length - 1  # where the bonus token replaced the first rejected proposal
        if length - 1 < len(proposals) and rejected < len(new_ids) and proposals[length - 1] != new_ids[rejected]:
            suffix = proposals[length:]
            rounds += bool(suffix)
            for i, token in enumerate(suffix):
                for shift in SUFFIX_SHIFTS:
                    q = rejected + 1 + i + shift
                    if 0 <= q < len(new_ids):
                        compared[str(shift)] += 1
                        matched[str(shift)] += int(new_ids[q] == token)
        start += length
    return {"rounds": rounds, "compared": compared, "matched": matched}


def merge_suffix_matches(parts: list) -> dict:
    """Sums `rejected_suffix_matches` results and adds `match_rate` per shift (None where nothing was compared)."""
    total = {"rounds": 0, "compared": {str(s): 0 for s in SUFFIX_SHIFTS}, "matched": {str(s): 0 for s in SUFFIX_SHIFTS}}
    for part in parts:
        total["rounds"] += part["rounds"]
        for key in ("compared", "matched"):
            for shift, n in part[key].items():
                total[key][shift] += n
    total["match_rate"] = {s: (total["matched"][s] / n if n else None) for s, n in total["compared"].items()}
    return total
