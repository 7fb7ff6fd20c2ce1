"""What the passes path of self-extend and dual-chunk costs beyond plain attention (issue 43 §3): block masks built
in closed form from each pass's band (rope_extend/attention/passes.py: `band_rows`, `band_dense`, `band_blocks`)
equal the masks evaluated on the whole grid; a decoding step runs without a host synchronisation and without
casting the cache.
"""

from __future__ import annotations

import pytest
import torch

from rope_extend.attention import passes, primitives
from rope_extend.attention.maps import DualChunkMap, SelfExtendMap

flex = pytest.importorskip("torch.nn.attention.flex_attention")


def _string_passes(window: int, shift_from: int, q0: int, k0: int):
    """STRING-shaped passes (a neighbour band [0, S) and a band [S, inf) whose queries move by the constant W - S,
    keys unmoved): the shapes a third method adds, built from the same Pass/band pieces."""
    s = shift_from
    return [
        passes.Pass("neighbour", None, False, (q0, k0, 1, 0, s), lambda p: (p - s + 1, p + 1), "cpu"),
        passes.Pass("shifted", lambda q_pos: torch.full_like(q_pos, window - s), False, (q0, k0, 1, s, passes.FAR),
                    lambda p: (k0, p - s + 1), "cpu"),
    ]


SHAPES = [  # (q0, k0, n_q, n_k): whole prompts (multiples of the block and not), chunked prefill (q0 != k0), a step
    (0, 0, 96, 96), (0, 0, 100, 100), (45, 0, 55, 100), (140, 17, 37, 160), (300, 3, 9, 306), (80, 80, 1, 1),
    (75, 0, 1, 76),
]
METHODS = {
    "self-extend": lambda q0, k0: SelfExtendMap(4, 24).passes(q0, k0, "cpu"),
    "self-extend-wide": lambda q0, k0: SelfExtendMap(2, 40).passes(q0, k0, "cpu"),
    "dual-chunk": lambda q0, k0: DualChunkMap(40, 12).passes(q0, k0, "cpu"),
    "dual-chunk-small": lambda q0, k0: DualChunkMap(12, 5).passes(q0, k0, "cpu"),
    "string": lambda q0, k0: _string_passes(48, 20, q0, k0),
}


def _rows_of(num, indices):
    """Each query block's listed key blocks (the first `num` entries: the rest is never read)."""
    return [indices[0, 0, i, : int(num[0, 0, i])].tolist() for i in range(num.shape[-1])]


@pytest.mark.parametrize("block", [16, 128])
@pytest.mark.parametrize("method", list(METHODS))
def test_block_masks_in_closed_form_equal_the_grid(method, block):
    """For every pass of self-extend, dual-chunk and a STRING-shaped method, at lengths that are and are not
    multiples of the block, prompts after a cached prefix (q0 != k0) and decoding shapes: the closed-form rows
    (`band_dense`) equal `mask_mod` evaluated on every pair, and `band_blocks` lists, per block of queries, the
    same partial and full key blocks in the same order as torch's `create_block_mask` on the grid; the BlockMask
    the FlexAttention primitive prepares has the same dense block map."""
    for q0, k0, n_q, n_k in SHAPES:
        for p in METHODS[method](q0, k0):
            where = (method, p.name, q0, k0, n_q, n_k, block)
            grid = primitives.dense_mask(p.mask_mod, n_q, n_k, "cpu")
            assert torch.equal(passes.band_dense(p.band, n_q, n_k, "cpu"), grid), where
            want = flex.create_block_mask(p.mask_mod, None, None, n_q, n_k, device="cpu", BLOCK_SIZE=block)
            got = passes.band_blocks(p.band, n_q, n_k, block, "cpu")
            assert torch.equal(got[0], want.kv_num_blocks) and torch.equal(got[2], want.full_kv_num_blocks), where
            assert _rows_of(got[0], got[1]) == _rows_of(want.kv_num_blocks, want.kv_indices), where
            assert _rows_of(got[2], got[3]) == _rows_of(want.full_kv_num_blocks, want.full_kv_indices), where
            assert int(got[1].max()) < got[1].shape[-1] and int(got[3].max()) < got[3].shape[-1], where
            if block == 128:
                prepared = primitives.FlexPrimitive(compiled=False).prepare(p, n_q, n_k, "cpu")
                assert torch.equal(prepared.to_dense(), want.to_dense()), where
                assert prepared.seq_lengths == (n_q, n_k)


def test_flex_output_with_closed_form_masks_equals_the_grid_masks():
    """FlexAttention (eager) over the closed-form BlockMask gives the output and log-sum-exp it gives over
    create_block_mask's, for a pass with partial, full and empty blocks and rows that see nothing."""
    torch.manual_seed(0)
    n_q, n_k = 150, 190
    q, k, v = torch.randn(1, 4, n_q, 16), torch.randn(1, 2, n_k, 16), torch.randn(1, 2, n_k, 16)
    primitive = primitives.FlexPrimitive(compiled=False)
    for p in DualChunkMap(70, 10).passes(40, 0, "cpu"):
        ours = primitive.masked(q, k, v, primitive.prepare(p, n_q, n_k, "cpu"), 0.25)
        grid = primitive.masked(q, k, v, flex.create_block_mask(p.mask_mod, None, None, n_q, n_k, device="cpu"),
                                0.25)
        torch.testing.assert_close(ours[0], grid[0], atol=0, rtol=0)
        torch.testing.assert_close(ours[1], grid[1], atol=0, rtol=0)


# --- a decoding step: no host synchronisation, no cast of the cache --------------------------------------------------
SYNC_OPS = {"_local_scalar_dense", "equal", "is_nonzero"}  # what hands a tensor's value to the host


class _Counted:
    """aten ops run inside (a TorchDispatchMode), those that synchronise with the host (`.item()`, `int()`,
    `bool()` of a tensor, torch.equal; and Tensor.tolist, which reads memory without an op), and the largest
    tensor any dtype conversion read (a cast of the cache would read a whole cache slice)."""

    def __init__(self, monkeypatch):
        from torch.utils._python_dispatch import TorchDispatchMode

        self.ops, self.syncs, self.largest_cast = 0, [], 0
        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.ops += 1
                name = func.overloadpacket.__name__
                if name in SYNC_OPS:
                    counter.syncs.append(name)
                if name == "_to_copy" and isinstance(args[0], torch.Tensor):
                    counter.largest_cast = max(counter.largest_cast, args[0].numel())
                return func(*args, **(kwargs or {}))

        tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, "tolist", lambda t: counter.syncs.append("tolist") or tolist(t))
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@pytest.mark.parametrize("method", ["self-extend", "dual-chunk"])
def test_decoding_step_synchronises_nothing_and_casts_no_cache(method, monkeypatch):
    """A bf16 tiny Llama (SDPA, 4 layers) with the method forced onto the passes path with the CUDA primitive (FlexAttention;
    a decoding step is its math on the cache slices), 40 cached tokens: a decoding step (not one at a
    chunk start, where dual-chunk moves the keys of the chunk before, once) runs the primitive's decode on every layer, reads no tensor value on the host, converts nothing the size of a cache slice, and runs at
    most 1.5x the aten ops of the same step with YaRN; its logits equal one forward's (bf16 rounding)."""
    import tiny
    from helpers import SPECS, cache_kwargs
    from transformers import AutoModelForCausalLM, DynamicCache

    from rope_extend import patch_model, unpatch_model
    from rope_extend.attention import kernels

    config = tiny.make_config("llama")
    config.num_hidden_layers = 4  # the shape of the goal's bench (bench/decode_step.py --attention): 4 layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval().to(torch.bfloat16)
    ids = tiny.input_ids(46)
    counts = {}
    for name, spec in (("yarn", {"method": "yarn"}), (method, SPECS[method])):
        patch_model(model, **spec, factor=3)
        flex = primitives.FlexPrimitive(compiled=False)
        decoded = []
        monkeypatch.setattr(flex, "decode", lambda *a, _f=flex.decode, _d=decoded: _d.append(1) or _f(*a))
        monkeypatch.setattr(kernels, "select_path", lambda d, start, c, m, _s=kernels.select_path: "passes"
                            if start is not None else _s(d, start, c, m))
        monkeypatch.setattr(kernels, "primitive_for", lambda device, _p=flex: _p)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(ids[:, :40], **cache_kwargs(cache))
            for t in range(40, 44):  # dual-chunk's chunk starts at 42: its keys before it are moved then
                model(ids[:, t : t + 1], **cache_kwargs(cache))
            decoded.clear()
            with _Counted(monkeypatch) as counted:
                step = model(ids[:, 44:45], **cache_kwargs(cache)).logits
            decoded_in_step = len(decoded)
            last = model(ids[:, 45:46], **cache_kwargs(cache)).logits[0, -1]
            whole = model(ids).logits[0, -1]
        monkeypatch.undo()
        unpatch_model(model)
        assert cache.get_seq_length() == 46 and step.shape[1] == 1
        counts[name] = counted.ops
        if name == "yarn":
            continue
        assert decoded_in_step == model.config.num_hidden_layers  # the method's decode ran on every layer
        assert counted.syncs == [], counted.syncs
        assert counted.largest_cast < 40 * model.config.head_dim, counted.largest_cast
        torch.testing.assert_close(last.float(), whole.float(), atol=0.1, rtol=0.02)
    assert counts[method] <= 1.5 * counts["yarn"], counts


GENERATE_SPECS = {  # tiny windows on the 32-token tiny model: each method acts from the prompt on
    "self-extend": {"method": "self-extend", "group_size": 4, "neighbor_window": 8, "factor": 3},
    # the position map alone (length_scale 0): its length scale makes one forward differ from steps by design
    "dual-chunk": {"method": "dual-chunk", "chunk_size": 20, "local_window": 6, "length_scale": 0.0, "factor": 3},
    "string": {"method": "string", "shifted_offset": 12, "local_value": 4},
}


def test_generate_steps_synchronise_nothing(monkeypatch):
    """generate() passes its own position ids (and, for a left-padded batch, a padding mask): its decoding steps
    still read nothing from the device on the method's account. A bf16 tiny Llama (SDPA, 2 layers) with each method
    forced onto the passes path with the CUDA primitive (FlexAttention; a decoding step is its math on cache
    slices), greedy and sampling on batch 1, sampling on a left-padded batch of 2: every decoding step of
    generate() runs the primitive's decode on every layer (for each row of the padded batch) and has exactly the
    host synchronisations of the same step of the unpatched model (transformers' own, counted as
    bench/decode_step.py counts them); the logits of every step equal one forward over each row's own tokens (bf16
    rounding)."""
    import tiny
    from transformers import AutoModelForCausalLM

    from rope_extend import patch_model, unpatch_model
    from rope_extend.attention import kernels
    from rope_extend.attention import runtime as runtime_module

    config = tiny.make_config("llama")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval().to(torch.bfloat16)
    prompts = [tiny.input_ids(40, seed=1)[0], tiny.input_ids(33, seed=2)[0]]
    batch = torch.zeros(2, 40, dtype=torch.long)
    mask = torch.zeros(2, 40, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        batch[row, 40 - len(prompt):], mask[row, 40 - len(prompt):] = prompt, 1
    cases = {"greedy-1": (batch[:1], mask[:1], False), "sampling-1": (batch[:1], mask[:1], True),
             "sampling-padded": (batch, mask, True)}  # greedy and sampling differ only in generate's own code
    new = 3

    counter = _Counted(monkeypatch)  # one counter (it patches Tensor.tolist once), read step by step

    def run(case):
        """Step logits [B, new, vocab], output ids, and per decoding step its host synchronisations (hooks on the
        model, whose forward generate() inspects for `position_ids`, not a replaced forward)."""
        ids, attention, sample = cases[case]
        steps = []

        def enter(module, args, kwargs):
            if kwargs["input_ids"].shape[1] == 1:
                counter.syncs.clear()
                counter.__enter__()

        def leave(module, args, kwargs, output):
            if kwargs["input_ids"].shape[1] == 1:
                counter.__exit__(None, None, None)
                steps.append(list(counter.syncs))

        hooks = [model.register_forward_pre_hook(enter, with_kwargs=True),
                 model.register_forward_hook(leave, with_kwargs=True)]
        torch.manual_seed(1)
        try:
            with torch.no_grad():
                out = model.generate(ids, attention_mask=attention, max_new_tokens=new, min_new_tokens=new,
                                     do_sample=sample, pad_token_id=0, return_dict_in_generate=True,
                                     output_logits=True)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.stack(out.logits, 1), out.sequences, steps

    plain = {case: run(case)[2] for case in cases}
    rows = []
    monkeypatch.setattr(runtime_module, "_by_rows", lambda *a, _f=runtime_module._by_rows: rows.append(1) or _f(*a))
    flex = primitives.FlexPrimitive(compiled=False)
    decoded = []
    monkeypatch.setattr(flex, "decode", lambda *a, _f=flex.decode: decoded.append(1) or _f(*a))
    monkeypatch.setattr(kernels, "select_path", lambda d, start, c, m, _s=kernels.select_path: "passes"
                        if start is not None else _s(d, start, c, m))
    monkeypatch.setattr(kernels, "primitive_for", lambda device, _p=flex: _p)
    for method, spec in GENERATE_SPECS.items():
        patch_model(model, **spec)
        try:
            for case, (ids, attention, _) in cases.items():
                decoded.clear()
                rows.clear()
                logits, sequences, steps = run(case)
                assert len(steps) == new - 1 and steps == plain[case], (method, case, steps, plain[case])
                layers = config.num_hidden_layers
                assert len(decoded) == (new - 1) * layers * len(ids), (method, case)  # the method's decode ran
                assert len(rows) == ((new - 1) * layers if len(ids) > 1 else 0), (method, case)  # row by row
                for row in range(len(ids)):
                    own = sequences[row][attention[row].bool().tolist() + [True] * new]  # the row, unpadded
                    with torch.no_grad():
                        whole = model(own[None, :-1]).logits[0, -new:]
                    torch.testing.assert_close(logits[row].float(), whole.float(), atol=0.1, rtol=0.02)
        finally:
            unpatch_model(model)
