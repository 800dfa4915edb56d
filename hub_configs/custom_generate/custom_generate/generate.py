"""DFlash (+ReTrace) speculative decoding as a transformers `custom_generate` repo.

    out = target.generate(**inputs, custom_generate=REPO, trust_remote_code=True, assistant_model=drafter)

transformers loads this file and calls `generate(model=target, **every generate() argument)`. We run
transformers' own `generate()` unchanged, with one difference scoped to this call and this model: the
target's `_get_candidate_generator` is shadowed on the instance by one that returns the drafter's own
candidate generator (`drafter.make_candidate_generator`, the code that travelled with its weights, the
same object the drop-in path builds), and `_get_stopping_criteria` by one that hands the call's stopping
criteria to it (drafts are cut so that no criterion fires inside a round). Verification, sampling, stopping, streaming and outputs stay
transformers'; the class-level `generate()` hook that loading a drafter installs is neither read nor
changed, so this works when it is uninstalled. Needs no module of its own beyond this file.

Not thread-safe for concurrent `generate()` calls on the same target instance (the shadowing is per
instance, for the duration of the call).
"""

import torch
from transformers import StoppingCriteriaList

_MISSING = object()


class _AfterPrompt(StoppingCriteriaList):
    """The call's stopping criteria, never asked about the bare prompt (plain decoding never asks either):
    transformers 5.15 asks them about the first iteration's candidate, which is the prompt alone."""

    prompt_length = 0  # set once the prompt is known (when the candidate generator is built)

    def __call__(self, input_ids, scores, **kwargs):
        if input_ids.shape[1] <= self.prompt_length:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return super().__call__(input_ids, scores, **kwargs)


def _dflash_drafter(assistant_model):
    if assistant_model is None:
        raise ValueError(
            "This custom_generate runs DFlash speculative decoding and needs the drafter: "
            "target.generate(..., custom_generate=REPO, trust_remote_code=True, assistant_model=drafter)."
        )
    get_base = getattr(assistant_model, "get_base_model", None)  # a PeftModel around the drafter
    drafter = get_base() if callable(get_base) else assistant_model
    if not getattr(drafter, "_is_dflash_drafter", False) or not hasattr(drafter, "make_candidate_generator"):
        raise TypeError(
            f"assistant_model is a {type(drafter).__name__}, not a dflash-retrace drafter. Load one with "
            "AutoModel.from_pretrained(DRAFTER_REPO, trust_remote_code=True), or drop custom_generate to use "
            "transformers' own assisted generation."
        )
    return drafter


def _check_single_sequence(model, kwargs):
    config = kwargs.get("generation_config") or model.generation_config
    for name in ("num_beams", "num_return_sequences"):
        value = kwargs.get(name, getattr(config, name, 1)) or 1
        if value > 1:
            raise ValueError(
                f"{name}={value} cannot run with a DFlash drafter: speculative decoding verifies one sequence. "
                f"Use {name}=1 (greedy or sampling), or drop assistant_model."
            )


def generate(model, *args, **kwargs):
    assistant_model = kwargs.pop("assistant_model", None)
    drafter = _dflash_drafter(assistant_model)
    _check_single_sequence(model, kwargs)
    built, criteria = [], []

    def _get_stopping_criteria(*a, **k):
        criteria.append(_AfterPrompt(type(model)._get_stopping_criteria(model, *a, **k)))
        return criteria[-1]

    def _get_candidate_generator(**call):  # transformers passes every argument by keyword
        input_ids = call["input_ids"]
        if input_ids.shape[0] != 1:
            raise ValueError(
                f"DFlash speculative decoding runs one sequence at a time (got batch size {input_ids.shape[0]}). "
                "Call generate() once per prompt, without padding."
            )
        extra = {}
        if criteria:
            criteria[-1].prompt_length = input_ids.shape[1]
            extra["stopping_criteria"] = criteria[-1]
        generator = drafter.make_candidate_generator(
            model, call["generation_config"], call["logits_processor"], call["model_kwargs"], **extra
        )
        built.append(generator)
        return generator

    shadows = {"_get_candidate_generator": _get_candidate_generator, "_get_stopping_criteria": _get_stopping_criteria}
    previous = {name: model.__dict__.get(name, _MISSING) for name in shadows}
    for name, shadow in shadows.items():
        setattr(model, name, shadow)
    try:
        output = type(model).generate(model, *args, assistant_model=assistant_model, **kwargs)
    finally:
        for name, value in previous.items():
            if value is _MISSING:
                delattr(model, name)
            else:
                setattr(model, name, value)
    if not built:
        raise RuntimeError(
            "generate() finished without asking for a candidate generator, so the DFlash drafter was not used. "
            "Check that the arguments select assisted generation (num_beams=1)."
        )
    return output
