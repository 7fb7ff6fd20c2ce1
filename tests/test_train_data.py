"""rope_extend.train.data: packing, PoSE windows, held-out overlap (no model; the real SmolLM2 tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest

from rope_extend.train import data


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _corpus(n_tokens: int, streams: int = 1) -> data.Corpus:
    return data.Corpus([np.arange(n_tokens, dtype=np.int64) + 1000 * i for i in range(streams)])


def test_pose_positions_cover_the_target_range_and_never_repeat_within_a_window():
    window, target = 64, 1024
    dataset = data.WindowDataset(_corpus(2000), window, target, n=400, seed=3)
    assert dataset.pose
    seen = np.zeros(target, dtype=bool)
    distances = np.zeros(target, dtype=bool)
    for i in range(len(dataset)):
        sample = dataset[i]
        pos = sample["position_ids"].numpy()
        ids = sample["input_ids"].numpy()
        assert len(pos) == len(ids) == window
        assert (np.diff(pos) > 0).all()  # strictly increasing: no position repeats inside a window
        assert pos[0] == 0 and pos[-1] <= target - 1
        jump = int(np.flatnonzero(np.diff(pos) > 1)[0]) + 1 if (np.diff(pos) > 1).any() else None
        if jump is not None:
            # chunk 1 is a prefix of the span, chunk 2 contiguous text after it; the jump's token is not a target
            assert 1 <= jump <= (window + 1) // 2
            assert (np.diff(ids[:jump]) == 1).all() and (np.diff(ids[jump:]) == 1).all()
            assert ids[jump] > ids[jump - 1]
            assert int(sample["labels"][jump]) == data.IGNORE_INDEX
        assert bool((sample["attention_mask"] == 1).all())
        seen[pos] = True
        distances[pos[-1] - pos[0]] = True
    assert seen.mean() > 0.95  # positions up to the target length are all trained
    assert distances[target - window:].any() and distances.max()  # long relative distances occur
    assert max(np.flatnonzero(distances)) >= target - 8


def test_samples_are_drawn_by_index_alone():
    corpus = _corpus(5000, streams=3)
    a = data.WindowDataset(corpus, 32, 256, n=50, seed=7)
    b = data.WindowDataset(corpus, 32, 256, n=50, seed=7)
    for i in (0, 17, 49):
        assert all(bool((a[i][k] == b[i][k]).all()) for k in a[i])
    assert not bool((a[0]["input_ids"] == data.WindowDataset(corpus, 32, 256, n=50, seed=8)[0]["input_ids"]).all())


def test_full_windows_are_contiguous_text_at_positions_0_to_w():
    dataset = data.WindowDataset(_corpus(300), 64, 64, n=20, seed=0)
    assert not dataset.pose
    for i in range(len(dataset)):
        s = dataset[i]
        assert (s["position_ids"].numpy() == np.arange(64)).all()
        assert (np.diff(s["input_ids"].numpy()) == 1).all()
        assert bool((s["labels"] == s["input_ids"]).all())


def test_windows_never_cross_two_streams():
    dataset = data.WindowDataset(_corpus(100, streams=4), 40, 400, n=200, seed=1)
    for i in range(len(dataset)):
        ids = dataset[i]["input_ids"].numpy()
        assert len(set((ids // 1000).tolist())) == 1  # every token from one stream


def test_documents_get_the_tokenizers_markers_and_short_rows_are_joined(tokenizer):
    bos, eos = data.special_tokens(tokenizer)
    assert bos is None and eos == tokenizer.eos_token_id  # SmolLM2's tokenizer adds no BOS of its own
    rows = [data.Document(f"r{i}", f"Row number {i} says something short.") for i in range(40)]
    corpus = data.build_corpus(tokenizer, [("rows", rows, False)], window=64)
    assert corpus.sources[0].documents == 40
    assert sum(len(s) for s in corpus.streams) == corpus.sources[0].tokens
    for stream in corpus.streams:
        assert len(stream) >= 65 and stream[-1] == eos
    joined = np.concatenate(corpus.streams)
    assert int((joined == eos).sum()) == 40  # every row boundary is marked
    text = data.Document("a.txt", "word " * 30)
    with pytest.raises(ValueError, match="fewer than one training window"):
        data.build_corpus(tokenizer, [("a.txt", [text], True)], window=64)


def test_an_eval_text_overlapping_a_training_text_is_refused():
    train = [data.Document("plays.txt", "To be, or not to be, that is the question. " * 20 + "x" * 500)]
    with pytest.raises(ValueError, match="overlaps training text"):
        data.check_no_overlap(train, "Some preface. " + "To be, or not to be, that is the question. " * 6, "held.txt")
    with pytest.raises(ValueError, match="is one of the training texts"):
        data.check_no_overlap(train, train[0].text, "same.txt")
    data.check_no_overlap(train, "A completely different text about licences and warranties. " * 10, "licence.txt")


def test_pose_chunk2_sees_chunk1_through_the_explicit_mask():
    """transformers 5 reads a position jump without an attention mask (and without a cache: training) as a new
    packed sequence; the explicit all-ones mask of every training sample keeps chunk 2 attending to chunk 1."""
    import tiny
    import torch

    from rope_extend import patch_model
    from rope_extend.compat import TRANSFORMERS_V5

    model = tiny.make_model("llama")
    patch_model(model, method="yarn", factor=tiny.FACTOR)
    sample = data.WindowDataset(data.Corpus([np.arange(3, 120, dtype=np.int64)]), 24, tiny.SEQ, n=1, seed=5)[0]
    pos = sample["position_ids"]
    jump = int(torch.nonzero(pos.diff() > 1)[0]) + 1
    ids = sample["input_ids"][None]
    other = ids.clone()
    other[0, :jump] = (other[0, :jump] + 7) % tiny.VOCAB  # chunk 1 changes, chunk 2 stays
    batch = {"position_ids": pos[None], "attention_mask": sample["attention_mask"][None], "use_cache": False}
    with torch.no_grad():
        a = model(input_ids=ids, **batch).logits[0, jump:]
        b = model(input_ids=other, **batch).logits[0, jump:]
        bare_a = model(input_ids=ids, position_ids=pos[None], use_cache=False).logits[0, jump:]
        bare_b = model(input_ids=other, position_ids=pos[None], use_cache=False).logits[0, jump:]
    assert float((a - b).abs().max()) > 1e-3  # chunk 2's logits depend on chunk 1
    if TRANSFORMERS_V5:  # the pitfall the mask avoids: without it chunk 2 is cut off from chunk 1
        torch.testing.assert_close(bare_a, bare_b)


def test_datasets_folders_load_as_rows(tmp_path):
    """--dataset: a folder of .jsonl files and a save_to_disk folder both give one document per non-empty row."""
    import json

    datasets = pytest.importorskip("datasets")
    rows = [{"text": f"row {i} " * 5} for i in range(7)] + [{"text": "  "}]
    files = tmp_path / "jsonl"
    files.mkdir()
    (files / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name, docs = data.read_dataset(str(files))
    assert name == "jsonl" and [d.text for d in docs] == [r["text"] for r in rows[:7]]
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    assert [d.text for d in data.read_dataset(str(saved))[1]] == [r["text"] for r in rows[:7]]
    with pytest.raises(ValueError, match="no column 'body'"):
        data.read_dataset(str(saved), column="body")
