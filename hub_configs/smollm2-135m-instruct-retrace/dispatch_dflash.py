"""The `generate(assistant_model=drafter)` dispatch: transformers' assisted loop runs the drafter's own candidate
generator (`generation_dflash`), after the checks that would otherwise fail late or silently.

Part of the Hub payload: imports only torch, transformers and sibling modules.
"""

import contextlib
import contextvars
import inspect
import warnings

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerationMixin

from .generation_dflash import _unwrap

_MARKER = "_dflash_retrace_dispatch"
# The stopping criteria of the running `_assisted_decoding` call: transformers builds the candidate generator
# inside it without passing them on.
_STOPPING_CRITERIA = contextvars.ContextVar("dflash_retrace_stopping_criteria", default=None)


class CriteriaAfterPrompt(StoppingCriteriaList):
    """A call's stopping criteria, never asked about the bare prompt (plain decoding never asks either).

    transformers 5.15 asks the criteria about each candidate sequence before verifying it, and in the first
    iteration (zero proposals: the target prefills alone) that is the prompt itself: a criterion firing on the
    prompt (a stop string the prompt ends with, an exhausted max_time) would end generation with no new token.
    """

    def __init__(self, criteria, prompt_length: int):
        super().__init__(criteria)
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores, **kwargs):
        if input_ids.shape[1] <= self.prompt_length:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return super().__call__(input_ids, scores, **kwargs)


def _check_single_sequence(input_ids):
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"DFlash speculative decoding runs one sequence at a time (got batch size {input_ids.shape[0]}). "
            "Call generate() once per prompt, without padding."
        )


def _check_generation_config(generation_config, drafter):
    other_assistants = {
        "prompt_lookup_num_tokens": "prompt lookup decoding",
        "assistant_early_exit": "early-exit self-speculation",
        "assistant_ensemble_weight": "ensemble verification (not lossless)",
    }
    for name, what in other_assistants.items():
        if getattr(generation_config, name, None) is not None:
            raise ValueError(
                f"`{name}` asks for {what}, which cannot be combined with a DFlash drafter. Drop `{name}` "
                "(or drop `assistant_model` to use that method instead)."
            )
    if getattr(generation_config, "dola_layers", None) is not None:
        raise ValueError(
            f"dola_layers={generation_config.dola_layers!r} asks for DoLa decoding, which transformers skips when an "
            "assistant model is given: drop `dola_layers` or drop `assistant_model`."
        )
    if getattr(generation_config, "use_mtp", False):
        raise ValueError("`use_mtp=True` (multi-token prediction) cannot be combined with a DFlash drafter: drop one.")
    if (generation_config.num_beams or 1) > 1:
        raise ValueError(
            f"Beam search (num_beams={generation_config.num_beams}) cannot run with a DFlash drafter: speculative "
            "decoding verifies a single sequence. Use num_beams=1 (greedy or sampling), or drop `assistant_model`."
        )
    if (generation_config.num_return_sequences or 1) > 1:
        raise ValueError(
            f"num_return_sequences={generation_config.num_return_sequences} is not supported with a DFlash drafter "
            "(speculative decoding runs one sequence). Use num_return_sequences=1 and call generate() once per sample."
        )


def _check_builtin_path(drafter, do_sample: bool) -> None:
    """speculation_type="dflash": transformers' own generator drives the drafter; say what it cannot use."""
    config = drafter.config
    if getattr(config, "context", "hidden") != "hidden":
        raise ValueError(
            f"speculation_type='dflash' runs transformers' built-in DFlash generator, which gives the "
            f"drafter no target KV cache, but this drafter has context={config.context!r}. Drop "
            "speculation_type (generate(assistant_model=drafter) runs it), or use a context='hidden' drafter.")
    if getattr(drafter, "draft_to_target", None) is not None:
        warnings.warn(
            "speculation_type='dflash' runs transformers' built-in DFlash generator, which scores the "
            "proposals with the target's full LM head: this drafter's draft vocabulary "
            f"({config.draft_vocab_size:,} tokens, the only rows it was trained on) is not used, so "
            "it drafts differently (still lossless). Drop speculation_type to draft as trained.",
            stacklevel=5,
        )
    inert = {"max_proposals": (None, config.block_size - 1), "proposal_threshold": (0.0,), "lookup_threshold": (0.0,)}
    ignored = {name: getattr(config, name, values[0]) for name, values in inert.items()
               if getattr(config, name, values[0]) not in values}
    if do_sample and getattr(config, "proposal_policy", "argmax") == "argmax":
        ignored["proposal_policy"] = "argmax"
    if ignored:
        warnings.warn(
            "speculation_type='dflash' runs transformers' built-in DFlash generator, which proposes a whole block "
            f"(argmax, or sampled under do_sample): this drafter's {ignored} are not applied. Drop speculation_type "
            "to use them.",
            stacklevel=5,
        )
    if drafter.retrace is not None:
        warnings.warn(
            "speculation_type='dflash' runs transformers' built-in DFlash generator, which keeps no "
            "ReTrace memory: this ReTrace drafter runs as plain DFlash. Drop speculation_type to use ReTrace.",
            stacklevel=5,
        )


def install_dispatch() -> None:
    """Makes `generate(assistant_model=<DFlash drafter>)` use the drafter's own candidate generator.

    Idempotent across repeated imports (the library and any number of remote-code copies): the first
    install wraps transformers' methods once; each drafter then builds the generator its own code
    ships (`drafter.make_candidate_generator`). Every other assistant takes transformers' normal path.
    """
    current = GenerationMixin._get_candidate_generator
    if getattr(current, _MARKER, False):
        return
    original = current
    signature = inspect.signature(original)

    def _get_candidate_generator(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        assistant = bound.arguments.get("assistant_model")
        drafter = _unwrap(assistant)
        config = bound.arguments["generation_config"]
        if drafter is not None and getattr(config, "speculation_type", None) == "dflash":
            drafter.last_stats = None  # transformers' own generator runs: no statistics from this call
        if drafter is not None and _get_candidate_generator.enabled:
            if getattr(config, "speculation_type", None) == "dflash":
                _check_builtin_path(drafter, bool(config.do_sample))
                return original(self, *args, **kwargs)
            _check_single_sequence(bound.arguments["input_ids"])
            _check_generation_config(config, drafter)
            extra = {}
            if "stopping_criteria" in inspect.signature(drafter.make_candidate_generator).parameters:
                extra["stopping_criteria"] = _STOPPING_CRITERIA.get()  # (a drafter saved by an older payload: none)
            return drafter.make_candidate_generator(self, config, bound.arguments["logits_processor"],
                                                    bound.arguments["model_kwargs"], **extra)
        return original(self, *args, **kwargs)

    _get_candidate_generator.enabled = True
    _get_candidate_generator.original = original
    setattr(_get_candidate_generator, _MARKER, True)
    GenerationMixin._get_candidate_generator = _get_candidate_generator

    # Runs before transformers' own checks: beam search with an assistant would otherwise run silently
    # without it (a log warning only), and a vocabulary mismatch would get a message about tokenizers.
    original_validate = GenerationMixin._validate_generation_mode
    validate_signature = inspect.signature(original_validate)

    def _validate_generation_mode(self, *args, **kwargs):
        bound = validate_signature.bind(self, *args, **kwargs)
        drafter = _unwrap((bound.arguments.get("generation_mode_kwargs") or {}).get("assistant_model"))
        if drafter is not None and _get_candidate_generator.enabled:
            _check_generation_config(bound.arguments["generation_config"], drafter)
            drafter.check_target(self)
        return original_validate(self, *args, **kwargs)

    _validate_generation_mode.original = original_validate
    setattr(_validate_generation_mode, _MARKER, True)
    GenerationMixin._validate_generation_mode = _validate_generation_mode

    _install_criteria_handoff(_get_candidate_generator)


def _install_criteria_handoff(dispatch) -> None:
    """Wraps `_assisted_decoding` so that the call's stopping criteria reach the candidate generator built inside
    it (see `_STOPPING_CRITERIA`) while `dispatch` (the wrapped `_get_candidate_generator`) is enabled."""
    original = GenerationMixin._assisted_decoding
    signature = inspect.signature(original)

    def _assisted_decoding(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        ours = (_unwrap(arguments.get("assistant_model")) is not None and dispatch.enabled
                and getattr(arguments["generation_config"], "speculation_type", None) != "dflash")
        if not ours:
            return original(self, *args, **kwargs)
        token = None
        if arguments.get("stopping_criteria") is not None:
            criteria = arguments["stopping_criteria"] = CriteriaAfterPrompt(
                arguments["stopping_criteria"], arguments["input_ids"].shape[1])
            token = _STOPPING_CRITERIA.set(criteria)
        try:
            # Inference mode (as z-lab's loop runs) skips autograd's per-op bookkeeping that no_grad still does: a
            # round runs hundreds of small ops, and on fast hardware that bookkeeping is a measurable share of it
            # (examples/loop_overhead.py). What the call returns is copied back into ordinary tensors.
            with torch.inference_mode():
                result = original(*bound.args, **bound.kwargs)
        finally:
            if token is not None:
                _STOPPING_CRITERIA.reset(token)
            release = getattr(_unwrap(arguments.get("assistant_model")), "release_call_caches", None)
            if release is not None:  # (a drafter saved by an older payload has no call caches)
                release()
        return _ordinary_tensors(result)

    _assisted_decoding.original = original
    setattr(_assisted_decoding, _MARKER, True)
    GenerationMixin._assisted_decoding = _assisted_decoding


def _ordinary_tensors(value):
    """`value` with every inference-mode tensor in it (alone, or in the tuples and fields of generate()'s output)
    replaced by an ordinary copy, so that callers may write into it or use it in autograd."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.is_inference() else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_ordinary_tensors(item) for item in value)
    if isinstance(value, dict):  # ModelOutput: assign field by field (it keeps its attributes and keys in step)
        for key in list(value.keys()):
            value[key] = _ordinary_tensors(value[key])
    return value


def uninstall_dispatch() -> None:
    """Restores transformers' own methods: DFlash drafters then only run via `speculation_type="dflash"`."""
    for name in ("_get_candidate_generator", "_validate_generation_mode", "_assisted_decoding"):
        current = getattr(GenerationMixin, name)
        if getattr(current, _MARKER, False):
            setattr(GenerationMixin, name, current.original)


def dispatch_enabled() -> bool:
    current = GenerationMixin._get_candidate_generator
    return bool(getattr(current, _MARKER, False) and current.enabled)


@contextlib.contextmanager
def no_dispatch():
    """Within this block `generate(assistant_model=drafter)` takes transformers' normal path (opt-out)."""
    current = GenerationMixin._get_candidate_generator
    installed = getattr(current, _MARKER, False)
    previous = current.enabled if installed else None
    if installed:
        current.enabled = False
    try:
        yield
    finally:
        if installed:
            current.enabled = previous


__all__ = ["install_dispatch", "uninstall_dispatch", "no_dispatch", "dispatch_enabled", "CriteriaAfterPrompt"]
