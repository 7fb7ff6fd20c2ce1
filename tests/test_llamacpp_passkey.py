"""llama.cpp's own self-extend (`llama-passkey -gan G`) next to rope-extend's self-extend, on the same prompt.

`llama-passkey` (built from the same vendored llama.cpp as `llama-perplexity`) writes a classic repeated-filler
prompt with a random key and answers greedily; with `-gan G` it divides the cached positions by G before each
batch (its window is the batch size). rope-extend's self-extend on SmolLM2 in transformers gets the same text
(rebuilt from passkey.cpp's format) with G and W = the batch. A short prompt keeps this inside the CI budget; the
16k run is in docs/attention-methods.md.
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytestmark = pytest.mark.slow

JUNK, POSITION, GROUP, BATCH = 30, 12, 2, 128


def passkey_prompt(key: int, junk: int, position: int) -> str:
    """examples/passkey/passkey.cpp's prompt, character for character."""
    text = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will "
            "quiz you about the important information there.")
    for i in range(junk):
        if i == position:
            text += f" The pass key is {key}. Remember it. {key} is the pass key."
        text += " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    return text + " What is the pass key? The pass key is"


def test_llama_passkey_self_extend_next_to_rope_extend(llamacpp, demo_gguf, smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rope_extend import patch_model

    plain = llamacpp.passkey(demo_gguf, junk=JUNK, position=POSITION, group=1, batch=BATCH)
    grouped = llamacpp.passkey(demo_gguf, junk=JUNK, position=POSITION, group=GROUP, batch=BATCH)
    assert plain.key == grouped.key and plain.prompt_tokens == grouped.prompt_tokens
    assert plain.prompt_tokens > 4 * BATCH  # several batches: llama.cpp's grouping really divided positions
    assert plain.found, f"llama-passkey without grouping missed the key inside the window: {plain.answer!r}"

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    ids = tokenizer(passkey_prompt(plain.key, JUNK, POSITION), return_tensors="pt").input_ids
    assert abs(ids.shape[1] - plain.prompt_tokens) <= 0.02 * plain.prompt_tokens  # the same prompt
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch_model(model, method="self-extend", factor=1.5, group_size=GROUP, neighbor_window=BATCH)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id or 0)
    answer = tokenizer.decode(out[0, ids.shape[1]:])
    print(f"\nllama-passkey -gan 1: {plain.answer[:30]!r}; -gan {GROUP} -b {BATCH}: {grouped.answer[:30]!r}; "
          f"rope-extend self-extend G={GROUP} W={BATCH}: {answer!r} (key {plain.key}, {plain.prompt_tokens} tokens)")
    assert str(plain.key) in answer, f"rope-extend's self-extend missed the key: {answer!r}"
    assert grouped.answer  # llama.cpp's block-wise self-extend ran and answered (whether it holds the key is printed)
