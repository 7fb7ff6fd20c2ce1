"""The thin CLI commands: validate, methods, show, eval, patch --eval, --help examples, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rope_extend.cli import run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # not the working directory: pytest may run from anywhere


def test_validate_and_methods(capsys, tmp_path):
    assert run(["validate", str(CONFIGS / "qwen2.5-yarn-x4.yaml")]) == 0
    assert "original_max_position_embeddings: 32768" in capsys.readouterr().out
    assert run(["validate", str(CONFIGS / "yarn-x8.yaml"), "--original-length", "8192"]) == 0
    assert "target_length: 65536" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: yarn\nfactor: -1\n")
    assert run(["validate", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert run(["methods"]) == 0
    table = capsys.readouterr().out
    for name in ("linear", "ntk", "dynamic", "ntk-by-parts", "yarn", "dynamic-yarn", "llama3", "longrope"):
        assert name in table
    assert "beta_fast=32.0" in table and "attention factor: 0.1·ln s + 1" in table


def test_help_shows_examples():
    for command in ("patch", "eval", "show", "validate", "inspect"):
        done = subprocess.run([sys.executable, "-m", "rope_extend", command, "--help"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0 and "Example" in done.stdout, command


def test_unknown_option_is_one_line(capsys):
    assert run(["patch", "x", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bogus" in err[0]


def test_show(tiny_ckpt, capsys):
    assert run(["show", str(tiny_ckpt)]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "10000" in out and "max_position_embeddings: 256" in out


def test_eval_then_patch_with_eval_summary_in_card(tiny_ckpt, tmp_path, capsys):
    report = tmp_path / "report"
    assert run(["eval", str(tiny_ckpt), "--spec", "method=yarn,factor=2", "--suite", "smoke", "-o", str(report),
                "--no-plots"]) == 0
    lines = (report / "results.jsonl").read_text().splitlines()
    variants = {json.loads(line)["variant"] for line in lines}
    assert len(variants) == 2  # unpatched + yarn
    report_md = (report / "report.md").read_text()
    assert "Attention entropy" in report_md  # the smoke suite measures it at 128 and 256 tokens
    entropy = [json.loads(line) for line in lines if json.loads(line)["kind"] == "entropy"]
    assert len(entropy) == 4 and all(0 < r["metrics"]["mean_entropy"] < 6 for r in entropy)
    assert all(len(r["metrics"]["per_layer"]) == 2 for r in entropy)
    out = tmp_path / "out"
    assert run(["patch", str(tiny_ckpt), "--method", "yarn", "--factor", "2", "-o", str(out), "--eval", "smoke"]) == 0
    card = (out / "README.md").read_text()
    assert "No evaluation was run" not in card and "perplexity" in card.lower()
    assert "> **Smoke test.** The `smoke` suite" in card  # the report's banner travels with its tables
    from huggingface_hub import ModelCard

    results = ModelCard.load(out / "README.md").data.eval_results  # model-index entries, as the Hub reads them
    assert results and {r.metric_type for r in results} >= {"perplexity"}
    assert (tmp_path / "out-eval" / "results.jsonl").exists()


def test_cli_modules_import_without_a_cycle():
    """app.py is the leaf (it imports no other CLI module) and the CLI's own imports form no cycle."""
    import ast

    package = Path(__file__).resolve().parents[1] / "rope_extend" / "cli"
    edges = {}
    for path in package.glob("*.py"):
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets |= {node.module} if node.module else {alias.name for alias in node.names}
        edges[path.stem] = {t.split(".")[0] for t in targets if (package / f"{t.split('.')[0]}.py").exists()}
    assert edges["app"] == set() and "commands" in edges["main"] and "patch_cmd" in edges["commands"]

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges.get(start, ()))

    assert not [m for m in edges if m != "__init__" and reaches(m, m)]


def test_eval_with_a_bad_spec_leaves_no_folder(tiny_ckpt, tmp_path, capsys):
    """A spec, suite or model that fails validation is one line on stderr, exit 2, and no empty report folder."""
    broken = tmp_path / "broken-suite.yaml"
    broken.write_text("name: b\ndescription: the ceiling of x: the unpatched model\n")  # an unquoted ': '
    for args in (["--spec", "method=yarn,factor=-2"], ["--spec", "method=bogus"], ["--suite", "nosuch"],
                 ["--suite", str(broken)]):
        out = tmp_path / "report"
        assert run(["eval", str(tiny_ckpt), *args, "-o", str(out)]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (args, err)
        assert not out.exists(), args
    assert run(["eval", str(tmp_path / "missing"), "--spec", "method=yarn,factor=2", "-o", str(out)]) == 2
    assert not out.exists()


def test_eval_name_evaluates_the_checkpoint_as_it_loads_under_its_own_name(tiny_ckpt, tmp_path, capsys):
    """--name: MODEL's own row under that name (a trained checkpoint is not 'unpatched'), the same numbers as the
    unpatched row of a plain run, and no unpatched row; the reserved name is one line, exit 2."""
    plain, named = tmp_path / "plain", tmp_path / "named"
    assert run(["eval", str(tiny_ckpt), "--suite", "smoke", "-o", str(plain), "--no-plots"]) == 0
    assert run(["eval", str(tiny_ckpt), "--name", "trained yarn-x2", "--spec", "method=yarn,factor=2", "--suite", "smoke",
                "-o", str(named), "--no-plots"]) == 0
    records = [json.loads(line) for line in (named / "results.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in records} == {"trained yarn-x2", "yarn-x2"}
    reference = {r["case_id"]: r["metrics"] for r in map(json.loads, (plain / "results.jsonl").read_text().splitlines())}
    mine = [r for r in records if r["variant"] == "trained yarn-x2"]
    assert mine and all(r["metrics"].get("ppl") == reference[r["case_id"]].get("ppl") for r in mine)
    assert any("ppl" in r["metrics"] for r in mine)
    capsys.readouterr()
    assert run(["eval", str(tiny_ckpt), "--name", "unpatched", "-o", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--name 'unpatched'" in err[0] and not (tmp_path / "bad").exists()


def test_a_key_error_names_the_library_that_raised_it(tmp_path, capsys, monkeypatch):
    """A KeyError from inside another library (here the stdlib's os.environ) is named as that library's, not as an
    entry the user's files lack; one raised by rope-extend's own reading keeps the input wording."""
    import os
    import types

    from rope_extend import inspect as inspect_module

    def library_failure(*args, **kwargs):
        return os.environ["ROPE_EXTEND_NO_SUCH_VARIABLE"]

    def read_entry(*args, **kwargs):
        return {}["rope_theta"]

    own_failure = types.FunctionType(read_entry.__code__, {"__name__": "rope_extend.inspect"})  # raised in rope_extend

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    for failure, wanted in ((library_failure, "KeyError 'ROPE_EXTEND_NO_SUCH_VARIABLE' raised in os: an input may"),
                            (own_failure, "an input lacks the entry 'rope_theta' that rope-extend needs")):
        monkeypatch.setattr(inspect_module, "load_config", failure)
        assert run(["inspect", str(config)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("rope-extend: error:") and wanted in err[0], err


def test_patch_flags_are_write_options_fields(monkeypatch, capsys):
    """`patch`'s write flags are `WriteOptions`' fields, declared once (`cli.options.options_flags`): each flag field
    is one option of `patch` and the command receives the `WriteOptions` built from them (a --no-... flag sets its
    field false); train, engines and inspect share the spec's flags declared once in cli/options.py."""
    import typer.main

    from rope_extend.cli import options, patch_cmd
    from rope_extend.cli.app import app
    from rope_extend.write_options import WriteOptions

    seen = {}
    monkeypatch.setattr(patch_cmd, "_patch", lambda source, output, spec, opts, **kw: seen.update(spec=spec, opts=opts,
                                                                                                  **kw))
    assert run(["patch", "src", "--method", "yarn", "--factor", "2", "--mode", "full", "--dtype", "bfloat16",
                "--no-verify", "--no-memory-check", "--allow-pickle", "--revision", "r1", "-o", "out"]) == 0
    assert seen["opts"] == WriteOptions(mode="full", dtype="bfloat16", verify=False, memory_check=False,
                                        allow_pickle=True)
    assert (seen["spec"].method, seen["spec"].factor, seen["revision"]) == ("yarn", 2.0, "r1")
    command = typer.main.get_command(app)
    flags = {name: {opt for p in command.commands[name].params for opt in p.opts} for name in
             ("patch", "train", "engines", "inspect")}
    declared = [f.metadata.get("flag", "--" + f.name.replace("_", "-")) for f in options.flag_fields(WriteOptions)]
    assert declared == ["--mode", "--dtype", "--overwrite", "--no-verify", "--allow-pickle", "--trust-remote-code",
                        "--no-memory-check"]
    assert set(declared) <= flags["patch"]
    spec_flags = {"--method", "-m", "--factor", "-f", "--target-length", "-t", "--config", "-c"}
    assert all(spec_flags <= flags[name] for name in flags)
    assert all("--set" in flags[name] for name in ("patch", "train", "engines"))
    capsys.readouterr()


def test_eval_and_tune_flags_are_their_options_fields(monkeypatch, capsys):
    """`eval`'s flags are `EvalOptions`' and `EngineArgs`' fields and `tune`'s `TuneOptions`' (declared once, as
    `patch`'s are `WriteOptions`'): each command receives the object its flags build (a --no-... flag sets its field
    false), which `run_eval` / `tune_model` take."""
    from types import SimpleNamespace

    from rope_extend.eval import runner
    from rope_extend.eval.options import EngineArgs, EvalOptions
    from rope_extend.tune import runner as tune_runner
    from rope_extend.tune.options import TuneOptions

    seen = {}
    monkeypatch.setattr(runner, "run_eval", lambda model, specs, suite, out, options: seen.update(
        eval=(model, specs, suite, options)) or [])
    winner = SimpleNamespace(winner=SimpleNamespace(candidate=SimpleNamespace(name="yarn"), loss=1.0))
    monkeypatch.setattr(tune_runner, "tune_model", lambda model, target, out, options: seen.update(
        tune=(model, target, options)) or winner)
    assert run(["eval", "src", "-o", "out", "--spec", "method=yarn,factor=2", "--dtype", "bfloat16", "--no-baseline",
                "--no-resume", "--text", "a.txt", "--engine", "vllm", "--tensor-parallel-size", "2"]) == 0
    model, specs, suite, options = seen["eval"]
    assert (model, suite, [s["method"] for s in specs]) == ("src", "quick", ["yarn"])
    assert options == EvalOptions(dtype="bfloat16", include_baseline=False, resume=False, text=["a.txt"],
                                  engine="vllm", engine_args=EngineArgs(tensor_parallel_size=2))
    assert options.engine_args.given() == {"tensor_parallel_size": 2}
    assert run(["eval", "src", "-o", "out", "--name", "trained", "--no-memory-check"]) == 0
    assert seen["eval"][1] == [("trained", None)] and seen["eval"][3] == EvalOptions(include_baseline=False,
                                                                                     memory_check=False)
    assert run(["tune", "src", "--target-length", "256", "-o", "out", "--methods", "yarn, ntk", "--budget", "4",
                "--no-plots", "--attention-factor", "1"]) == 0
    assert seen["tune"] == ("src", 256, TuneOptions(methods=["yarn", "ntk"], budget=4.0, plots=False,
                                                    attention_factor=1.0))
    capsys.readouterr()


def test_a_shared_flag_has_one_help_in_every_command():
    """A flag several commands take (`flags.Flag`, `cli.options`' aliases) reads the same in each; each engine
    argument (`EngineArgs`) is one some run engine takes, and its help names exactly the engines whose adapters
    take it."""
    import dataclasses

    import typer.main

    from rope_extend import flags
    from rope_extend.cli.app import app
    from rope_extend.engines.runs import run_engines
    from rope_extend.eval.options import EngineArgs

    command = typer.main.get_command(app)
    helps: dict[str, set] = {}
    for cmd in command.commands.values():
        for param in cmd.params:
            for opt in param.opts:
                helps.setdefault(opt, set()).add(param.help)
    shared = [value for value in vars(flags).values() if isinstance(value, flags.Flag)]
    assert len(shared) >= 8
    for flag in shared:
        assert helps[flag.name] == {flag.help}, flag
    for opt in ("--revision", "--private", "--push-to-hub", "--json", "--no-memory-check", "--dtype"):
        assert len(helps[opt]) == 1, (opt, helps[opt])
    names = [f.name for f in dataclasses.fields(EngineArgs)]
    for engine in run_engines():
        assert set(engine.options) <= set(names), engine.name
    for f in dataclasses.fields(EngineArgs):
        takers = [engine.name for engine in run_engines() if f.name in engine.options]
        assert takers and f.metadata["help"].startswith(f"--engine {' or '.join(takers)}:"), (f.name, takers)
