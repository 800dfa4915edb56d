import os

import pytest
import torch

from tiny import continuations, prompts, tiny_target, train_drafter

# Tiny models: one thread avoids oversubscription (20x slower generate() on a busy 2-core machine).
torch.set_num_threads(int(os.environ.get("DFLASH_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def qwen3_target():
    return tiny_target("qwen3")


@pytest.fixture(scope="session")
def llama_target():
    return tiny_target("llama", seed=1)


@pytest.fixture(scope="session")
def train_prompts():
    return prompts(12)


def _trained(target, train_prompts, seed=0):
    rows = continuations(target, train_prompts, new_tokens=40)
    return train_drafter(target, rows, steps=400, block_size=8, layers=2, lr=5e-3, seed=seed)


@pytest.fixture(scope="session")
def qwen3_drafter(qwen3_target, train_prompts):
    """A drafter trained for a few hundred steps on the target's own greedy continuations (τ well above 1)."""
    return _trained(qwen3_target, train_prompts)


@pytest.fixture(scope="session")
def llama_drafter(llama_target, train_prompts):
    return _trained(llama_target, train_prompts, seed=1)
