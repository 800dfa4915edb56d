"""DFlash (+ReTrace) speculative decoding as a transformers `custom_generate` repo.

    out = target.generate(**inputs, custom_generate=REPO, trust_remote_code=True, assistant_model=drafter)

transformers loads this file and calls `generate(model=target, **every generate() argument)`. We run
transformers' own `generate()` unchanged, with one difference scoped to this call and this model: the
target's `_get_candidate_generator` is shadowed on the instance by one that returns the drafter's own
candidate generator (`drafter.make_candidate_generator`, the code that travelled with its weights, the
same object the drop-in path builds), and `_get_stopping_criteria` by one that hands the call's stopping
criteria to it (drafts are cut so that no criterion fires inside a round). Verification, sampling,
stopping, streaming and outputs stay transformers'; the class-level `generate()` hook that loading a
drafter installs is neither read nor changed, so this works when it is uninstalled. Needs no module of
its own beyond this file.

The checks are the drafter's own (`drafter.check_generation`, the payload function the dispatch runs): beam
search, several return sequences, batch size > 1 and other speculation methods in the same call (prompt lookup,
early exit, ensemble weights, MTP) are refused exactly as with the drop-in path, on the generation config
`generate()` resolved, together with the drafter/target shape checks (`drafter.check_target`).

Not thread-safe for concurrent `generate()` calls on the same target instance (the shadowing is per
instance, for the duration of the call).
"""

import inspect

import torch
from transformers import GenerationConfig, StoppingCriteriaList

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
    needed = ("make_candidate_generator", "check_generation", "check_target")
    if not getattr(drafter, "_is_dflash_drafter", False) or not all(hasattr(drafter, name) for name in needed):
        raise TypeError(
            f"assistant_model is a {type(drafter).__name__}, not a dflash-retrace drafter. Load one with "
            "AutoModel.from_pretrained(DRAFTER_REPO, trust_remote_code=True), or drop custom_generate to use "
            "transformers' own assisted generation."
        )
    return drafter


def generate(model, *args, **kwargs):
    assistant_model = kwargs.pop("assistant_model", None)
    drafter = _dflash_drafter(assistant_model)
    built, criteria = [], []
    validate = model._validate_generation_mode

    def _validate_generation_mode(*call_args, **call_kwargs):  # every mode passes here, with the final config
        config = next(a for a in (*call_args, *call_kwargs.values()) if isinstance(a, GenerationConfig))
        drafter.check_generation(config)
        drafter.check_target(model)
        return validate(*call_args, **call_kwargs)

    def _get_stopping_criteria(*a, **k):
        criteria.append(_AfterPrompt(type(model)._get_stopping_criteria(model, *a, **k)))
        return criteria[-1]

    def _get_candidate_generator(**call):  # transformers passes every argument by keyword
        drafter.check_generation(call["generation_config"], call["input_ids"])
        extra = {}
        if criteria and "stopping_criteria" in inspect.signature(drafter.make_candidate_generator).parameters:
            criteria[-1].prompt_length = call["input_ids"].shape[1]
            extra["stopping_criteria"] = criteria[-1]
        generator = drafter.make_candidate_generator(
            model, call["generation_config"], call["logits_processor"], call["model_kwargs"], **extra
        )
        built.append(generator)
        return generator

    shadows = {"_validate_generation_mode": _validate_generation_mode,
               "_get_candidate_generator": _get_candidate_generator,
               "_get_stopping_criteria": _get_stopping_criteria}
    previous = {name: model.__dict__.get(name, _MISSING) for name in shadows}
    model.__dict__.update(shadows)
    try:
        output = type(model).generate(model, *args, assistant_model=assistant_model, **kwargs)
    finally:
        for name, value in previous.items():
            if value is _MISSING:
                del model.__dict__[name]
            else:
                model.__dict__[name] = value
    if not built:
        raise RuntimeError(
            "generate() finished without asking for a candidate generator, so the DFlash drafter was not used. "
            "Check that the arguments select assisted generation (num_beams=1)."
        )
    return output
