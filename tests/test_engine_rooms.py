"""An engine is one registered room (issue 64): a throwaway engine registered from outside the package appears in the
parity report, the audit, the card and the docs table with no other edit, and what its rules do not cover -- a
rope_type without a rule, a config feature its port does not model -- is reported unchecked, never identical.

`Toy` is a serving engine as a room writes one: a port that reads transformers 5's rope_parameters and computes plain
and linear RoPE (the formulas of the Position Interpolation paper: θ_i = b^(-2i/d), divided by s), rules for those two
rope types only, one card route.
"""

from __future__ import annotations

import json
import warnings

import hubcache
import pytest
import tiny
import torch

from rope_extend.cli import run
from rope_extend.engines import hf_config
from rope_extend.engines.hint import COMMAND, MODEL, EngineHint, Route
from rope_extend.engines.parity import parity_many, serving_table, table_variants
from rope_extend.engines.registry import AuditRoute, ServingEngine, registered, serving_engines
from rope_extend.engines.served import NotServed, Served, Unchecked
from rope_extend.engines.serving import serving_hints
from rope_extend.plan import plan_patch

L, S = tiny.ORIGINAL, tiny.FACTOR


class Toy(ServingEngine):
    name, title, version = "toy", "Toy", "Toy 1.0"
    rope_types = ("default", "linear")
    features = frozenset()
    routes = (Route("this checkpoint", COMMAND, "- Toy", False, None, column="Toy"),)

    def serve(self, written) -> EngineHint:
        (route,) = self.routes
        return EngineHint(self.name, self.title, self.version,
                          (route.filled(f"toy serve {MODEL} --length {written.target_length}", "settings"),))

    def served(self, route, config, n) -> Served | NotServed:
        fields, rope = hf_config.load(dict(config))
        dim = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
        kind = rope.get("rope_type", "default")
        if kind not in self.rope_types:
            return NotServed(f"Toy serves no {kind!r}")
        inv = 1.0 / (float(rope["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        return Served(inv_freq=(inv / float(rope.get("factor") or 1.0)).float())

    def audit_routes(self, model) -> list[AuditRoute]:
        _, rope = hf_config.load(dict(model.loaded))
        reason = self.audit_unchecked(model, rope)
        route = Route("this checkpoint", COMMAND, "", False, None)
        return [AuditRoute("this checkpoint", f"toy serve {model.name}", {
            group: tuple(Unchecked(reason) if reason else self.served(route, model.loaded, n)
                         for n in model.lengths) for group in model.groups})]


@pytest.fixture
def toy():
    with registered(Toy()) as engine:
        yield engine
    assert "toy" not in [e.name for e in serving_engines()]


def _plan(method: str, arch: str = "llama"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_patch(tiny.make_config(arch), **tiny.spec_kwargs(method, arch))


def test_a_throwaway_engine_joins_the_report_the_hints_and_the_table(toy):
    config = tiny.make_config("llama").to_dict()
    linear, yarn = parity_many([(config, {"method": "linear", "factor": S}), (config, {"method": "yarn", "factor": S})],
                               other_line=False)
    (row,) = [r for r in linear.rows if r.engine == "Toy 1.0"]
    assert row.identical and row.serves == ("Toy", COMMAND) and "Toy 1.0 (this checkpoint)" in linear.markdown()
    (row,) = [r for r in yarn.rows if r.engine == "Toy 1.0"]
    assert row.unchecked and row.label == "unchecked" and not row.identical and not row.differs
    assert "rope_type default, linear, not 'yarn'" in row.short.reason
    text = yarn.markdown()
    assert "Toy 1.0 (this checkpoint)" not in text.split("\n")[0]  # never among "serves identically"
    assert "Unchecked" in text and "- Toy 1.0: Toy 1.0's rules here cover rope_type default, linear" in text
    card, _ = serving_hints(_plan("linear"), "OUT")
    assert f"- Toy: `toy serve OUT --length {L * S}`" in card and "Toy 1.0" in card.split("\n")[0]
    card, _ = serving_hints(_plan("yarn"), "OUT")
    assert "- Toy: unchecked: Toy 1.0's rules here cover rope_type default, linear, not 'yarn'" in card
    assert "| Toy |" in serving_table().split("\n")[0] + "|"
    assert len(table_variants()) == len(serving_table().split("\n")) - 2


def test_a_feature_the_port_does_not_model_is_unchecked(toy):
    """Gemma 3's RoPE per layer type: the toy's port does not model it, whatever the rope_type."""
    config = tiny.make_config("gemma3_text").to_dict()
    (report,) = parity_many([(config, {"method": "linear", "factor": S})], other_line=False)
    rows = [r for r in report.rows if r.engine == "Toy 1.0"]
    assert rows and all(r.unchecked for r in rows)
    assert "does not model RoPE parameters per layer type" in rows[0].short.reason


def test_the_written_card_and_the_engines_command_pick_it_up(toy, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    source = tmp_path / "src"
    tiny.make_model("llama").save_pretrained(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(["patch", str(source), "--method", "yarn", "--factor", str(S), "-o", str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- Toy: unchecked: Toy 1.0's rules here cover rope_type default, linear, not 'yarn'" in card
    assert "| Toy 1.0 | this checkpoint | unchecked |" in card
    capsys.readouterr()
    assert run(["engines", str(tmp_path / "out"), "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["engine"] == "Toy 1.0"]
    assert [r["label"] for r in rows] == ["unchecked"] and not rows[0]["identical"]


def test_the_audit_picks_it_up_and_says_what_it_did_not_check(toy, tmp_path, monkeypatch, capsys):
    from rope_extend.engines.audit import audit

    cache = tmp_path / "hub"
    hubcache.build_config(cache, "Qwen/Qwen2.5-7B-Instruct", hubcache.QWEN_YARN)
    hubcache.build_config(cache, "meta-llama/Llama-2-7b-hf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("ROPE_EXTEND_OTHER_PYTHON", raising=False)
    verdict = next(v for v in audit("Qwen/Qwen2.5-7B-Instruct").verdicts() if v.engine == "Toy 1.0")
    assert verdict.identical is None and "Toy 1.0's rules here cover rope_type default, linear" in verdict.why
    verdict = next(v for v in audit("meta-llama/Llama-2-7b-hf").verdicts() if v.engine == "Toy 1.0")
    assert verdict.identical is True and verdict.command == "toy serve meta-llama/Llama-2-7b-hf"
