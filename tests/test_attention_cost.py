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
    "self-extend": lambda q0, k0: passes.method_passes(SelfExtendMap(4, 24), q0, k0, "cpu"),
    "self-extend-wide": lambda q0, k0: passes.method_passes(SelfExtendMap(2, 40), q0, k0, "cpu"),
    "dual-chunk": lambda q0, k0: passes.method_passes(DualChunkMap(40, 12), q0, k0, "cpu"),
    "dual-chunk-small": lambda q0, k0: passes.method_passes(DualChunkMap(12, 5), q0, k0, "cpu"),
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
    for p in passes.method_passes(DualChunkMap(70, 10), 40, 0, "cpu"):
        ours = primitive.masked(q, k, v, primitive.prepare(p, n_q, n_k, "cpu"), 0.25)
        grid = primitive.masked(q, k, v, flex.create_block_mask(p.mask_mod, None, None, n_q, n_k, device="cpu"),
                                0.25)
        torch.testing.assert_close(ours[0], grid[0], atol=0, rtol=0)
        torch.testing.assert_close(ours[1], grid[1], atol=0, rtol=0)
