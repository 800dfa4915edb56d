"""Tiny random targets and a quickly trained drafter, shared by the tests (CPU, fp32, seconds)."""

import itertools

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM, StoppingCriteria

from dflash_retrace import DFlashDrafter
from dflash_retrace.training.objective import dflash_block_loss, sample_anchors

VOCAB = 96
EOS = 2


def tiny_target(family: str = "qwen3", seed: int = 0, layers: int = 4, max_position_embeddings: int = 1024):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_position_embeddings, eos_token_id=EOS, bos_token_id=1,
        pad_token_id=0,
    )
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, tie_word_embeddings=False, **common))
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(family)
    # Never end on EOS by chance: tests that need EOS choose it explicitly.
    model.generation_config.eos_token_id = None
    return model.eval()


class WindowSum(StoppingCriteria):
    """Stops when the last two tokens sum to a multiple of `modulus` (fires at positions no round is aligned to)."""

    def __init__(self, prompt_length, modulus):
        self.prompt_length, self.modulus = prompt_length, modulus

    def __call__(self, input_ids, scores, **kwargs):
        if input_ids.shape[1] < self.prompt_length + 2:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return (input_ids[:, -2:].sum(-1) % self.modulus) == 0


def tiny_tokenizer():
    """Ids 3..95 are the two-letter strings aa, ab, ... over 'abcdefghij' (text: the strings joined), so stop
    strings can span tokens; 0-2 are <pad>, <s>, </s>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["".join(p) for p in itertools.product("abcdefghij", repeat=2)][: VOCAB - 3]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{piece: i + 3 for i, piece in enumerate(pieces)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(".."), behavior="isolated")  # "abcdef" -> ab cd ef
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def prompts(n: int, length: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (1, length), generator=g) for _ in range(n)]


def continuations(target, prompt_list, new_tokens: int = 48):
    rows = []
    for p in prompt_list:
        out = target.generate(p, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
        mask = torch.zeros(out.shape[1], dtype=torch.bool)
        mask[p.shape[1]:] = True
        rows.append((out[0], mask))
    return rows


def greedy_tau(target, drafter, rows, new_tokens: int) -> float:
    """τ pooled over the prompts of `rows` (continuations), each output asserted equal to plain greedy generate()."""
    lengths = []
    for ids, mask in rows:
        prompt = ids[~mask][None]
        ref = target.generate(prompt, do_sample=False, max_new_tokens=new_tokens)
        out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=new_tokens)
        assert torch.equal(ref, out)
        lengths += drafter.last_stats.acceptance_lengths
    return sum(lengths) / len(lengths)


def train_drafter(target, rows, steps=300, block_size=8, layers=2, lr=3e-3, seed=0, retrace=False, drafter=None):
    torch.manual_seed(seed)
    drafter = drafter or DFlashDrafter.from_target(target, num_hidden_layers=layers, block_size=block_size, retrace=retrace)
    drafter.train()
    for p in target.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        ids, mask = rows[step % len(rows)]
        anchors = sample_anchors(mask, 16, generator=g)
        loss, _ = dflash_block_loss(drafter, target, ids, mask, anchors)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
    return drafter.eval()
