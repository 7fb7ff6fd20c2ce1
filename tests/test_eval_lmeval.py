"""lm-eval tasks in eval/tasks run end to end, offline, on a tiny random checkpoint."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from rope_extend.eval.lm_tasks import (
    TASKS_DIR,
    build_docs,
    load_dataset,
    run_lm_eval,
    write_task_data,
)

LEN = 240


def test_generated_data_exact_lengths(tiny_ckpt, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt))
    paths = write_task_data(tok, tmp_path, tasks=("passkey", "niah_multikey", "perplexity"), lengths=[LEN, 300],
                            depths=[0.0, 1.0], num_needles=2)
    docs = [json.loads(x) for x in paths["passkey"].read_text().splitlines()]
    assert [(d["length"], d["depth"]) for d in docs] == [(LEN, 0.0), (LEN, 1.0), (300, 0.0), (300, 1.0)]
    for d in docs:
        assert d["target"] in d["input"]
        # re-tokenising the text may merge a token or two at segment joins, never more
        assert abs(len(tok(d["input"], add_special_tokens=False).input_ids) - d["length"]) <= 3
    ds = load_dataset("passkey", data_dir=str(tmp_path), max_seq_lengths=[300])["test"]
    assert len(ds) == 2 and set(ds["length"]) == {300}
    ppl = build_docs(tok, "perplexity", [LEN], samples=2)
    assert len(ppl) == 2 and ppl[0]["page"] != ppl[1]["page"]
    with pytest.raises(FileNotFoundError, match="rope-extend eval-tasks"):
        load_dataset("vt", data_dir=str(tmp_path / "missing"))


def test_in_memory_patched_model(tiny_ckpt):
    from rope_extend.eval.variants import apply_spec, load_model

    model, tok = load_model(tiny_ckpt)
    apply_spec(model, {"method": "yarn", "factor": 2.0})
    out = run_lm_eval(model, tok, ["rope_passkey", "rope_perplexity"], lengths=[LEN],
                      metadata={"depths": [0.5]}, limit=2)
    res = out["results"]
    assert 0.0 <= res["rope_passkey"]["score,none"] <= 1.0
    assert res["rope_perplexity"]["token_perplexity,none"] > 1.0


def test_lm_eval_cli(tiny_ckpt):
    """`lm_eval --model hf --model_args pretrained=CKPT --include_path eval/tasks --tasks ...` offline."""
    import os
    import subprocess
    import sys

    cmd = [
        sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={tiny_ckpt},max_length=320",
        "--device", "cpu", "--include_path", str(TASKS_DIR), "--tasks", "rope_niah_single,rope_passkey",
        "--metadata", json.dumps({"max_seq_lengths": [LEN], "depths": [0.5]}), "--limit", "1",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert "rope_niah_single" in table and "rope_passkey" in table and "score" in table


def test_every_prompt_gets_its_probes_answer_budget(tiny_ckpt):
    """issue 66 item 12: rope_niah_multivalue.yaml and rope_vt.yaml fixed max_gen_toks at 48 and 32 while the probes
    take 12 and 8 tokens per needle: with 8 needles lm-eval cut the answer. Built by lm-eval itself from the task
    files, every request's max_gen_toks is its prompt's budget, the probe's declaration (`Probe.max_new_tokens`),
    and holds the whole right answer as the tokenizer writes it; no task file writes a budget of its own."""
    import yaml
    from lm_eval.tasks import TaskManager, get_task_dict
    from transformers import AutoTokenizer

    from rope_extend.eval.probes import get_probe, probe_names

    tok = AutoTokenizer.from_pretrained(str(tiny_ckpt))
    needles = 8
    metadata = {"tokenizer": str(tiny_ckpt), "max_seq_lengths": [400], "num_needles": needles, "depths": [0.5]}
    tasks = get_task_dict([f"rope_{name}" for name in probe_names()],
                          TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata))
    assert set(tasks) == {f"rope_{name}" for name in probe_names()}
    budgets = {}
    for name, task in tasks.items():
        task.build_all_requests(limit=2)
        assert task.instances
        for request in task.instances:
            doc, (_, settings) = request.doc, request.arguments
            assert settings["max_gen_toks"] == doc["max_new_tokens"]
            assert len(tok(" " + ", ".join(doc["answers"]), add_special_tokens=False).input_ids) <= settings["max_gen_toks"]
            assert settings["max_gen_toks"] == get_probe(doc["task"]).max_new_tokens(needles)
            budgets[doc["task"]] = settings["max_gen_toks"]
        config = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text().replace("!function", ""))
        assert "max_gen_toks" not in config["generation_kwargs"], name
    assert budgets == {"passkey": 8, "niah_single": 12, "niah_multikey": 12, "niah_multivalue": 96, "vt": 64}
