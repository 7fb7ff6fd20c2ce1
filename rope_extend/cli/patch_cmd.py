"""`rope-extend patch` and `rope-extend show`: thin wrappers over rope_extend.checkpoint and rope_extend.hub."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import AlreadyScaledError, CheckpointError, NoExtensionError, ShorterWindowError
from ..terminal import shell_path
from ..write_options import WriteOptions
from .app import Progress, app, console, fail, say, say_command
from .options import (
    Factor,
    Method,
    Private,
    PushToHub,
    Revision,
    Sets,
    SpecFile,
    TargetLength,
    build_spec,
    options_flags,
)

if TYPE_CHECKING:
    from ..spec import RopeSpec

EXAMPLES = """Examples:

  rope-extend patch ./my-model --method yarn --factor 8 -o out/my-model-yarn8

  rope-extend patch meta-llama/Llama-3.1-8B --method yarn --target-length 262144 --set replace_existing=true -o out/llama-256k

  rope-extend patch ./my-model --config configs/yarn-x8.yaml --set beta_fast=64 -o out/

  rope-extend patch Qwen/Qwen2.5-7B-Instruct --config configs/qwen2.5-yarn-x4.yaml -o out/ --push-to-hub me/qwen-128k --private

  rope-extend patch ./my-model --method linear --factor 2 --mode full --dtype bfloat16 -o out/
"""


def with_command(exc: Exception, source: str, output: Path, spec_args: dict) -> Exception:
    """An AlreadyScaledError / ShorterWindowError / NoExtensionError with the whole command of its way forward appended (the same SOURCE,
    OUT, --config, --method, --revision and --set keys, with the spec keys of `exc.fix` in place of the factor or
    target length), ready to paste."""
    import shlex

    fix = getattr(exc, "fix", None)
    if not fix:
        return exc
    sets = [item for item in spec_args["sets"] if item.split("=", 1)[0].strip().replace("-", "_")
            not in ("factor", "target_length", *fix)]
    words = ["rope-extend", "patch", source]
    for flag, key in (("--revision", "revision"), ("--config", "config"), ("--method", "method")):
        if spec_args.get(key) is not None:
            words += [flag, str(spec_args[key])]
    if "target_length" in fix:
        words += ["--target-length", str(fix["target_length"])]
    else:  # the user's own length
        for key in ("factor", "target_length"):
            if spec_args.get(key) is not None:
                words += ["--" + key.replace("_", "-"), f"{spec_args[key]:g}"]
    for item in sets:
        words += ["--set", item]
    words += [item for key, value in fix.items() if key != "target_length"
              for item in ("--set", f"{key}={str(value).lower()}")]
    words += ["-o", str(output)]
    return type(exc)(f"{exc}. Run: {shlex.join(words)}", fix=fix)


HANG = " " * len("serve:  ")  # where the next-step lines continue


def say_next_steps(folder: Path, hint) -> None:
    """`output:` the checkpoint and `serve:` the one way to serve it to try first (an `engines.serving.ServeHint`),
    shell-quoted and wrapped so that it pastes whole."""
    say(f"output: {shell_path(folder)}", hang=HANG)
    say_command("serve:  ", "\n".join(hint.lines) if hint.python else hint.command, hint.python)
    if hint.python:
        say(f"# {hint.why}", indent=HANG, hang=HANG + "# ")


def refuse_out_early(source: str, output: Path, overwrite: bool) -> None:
    """The refusals of an existing OUT that need neither SOURCE's files nor `rope_extend.checkpoint`, whose imports
    (torch and transformers, through the engines' ports) take ~3 s, 9 s on a loaded 2-core machine: re-running a
    `patch` whose OUT exists is refused at once (issue 66). `checkpoint.check_output_path` makes the same refusals
    again, in the same words, with the rest; an OUT it words otherwise (a link; the root, home or current folder; an
    OUT that is, holds or is inside a local SOURCE) is left to it."""
    from .. import outputs

    out = output.expanduser().absolute()
    if out.is_symlink() or not out.is_dir():
        return
    resolved, local = out.resolve(), Path(source).expanduser()
    special = {Path(resolved.anchor), Path.home().resolve(), Path.cwd().resolve()}
    if resolved in special or (local.exists() and (resolved == local.resolve() or resolved in local.resolve().parents
                                                   or local.resolve() in resolved.parents)):
        return
    outputs.check_replaceable(out, "checkpoint", str(output))
    if any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"OUT {str(output)!r} exists and is not empty; pass --overwrite to replace it")


def _check_eval_dir(source: Path, output: Path, report_dir: Path) -> None:
    """The eval report must not land in SOURCE or OUT (SOURCE is never written; OUT is replaced atomically)."""
    report, src, out_ = report_dir.expanduser().resolve(), source.resolve(), output.expanduser().resolve()
    if report == src or src in report.parents:
        raise CheckpointError(f"--eval-dir {str(report_dir)!r} is inside SOURCE, which rope-extend never writes; "
                              "choose a folder outside it")
    if report == out_ or out_ in report.parents or report in src.parents:
        raise CheckpointError(f"--eval-dir {str(report_dir)!r} overlaps OUT or contains SOURCE; choose a folder "
                              "beside OUT (the default is OUT-eval)")


@app.command(epilog=EXAMPLES)
@options_flags(options=WriteOptions)
def patch(
    source: Annotated[str, typer.Argument(help="Local checkpoint folder or Hub repo id.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output folder (created atomically).")],
    method: Method = None,
    factor: Factor = None,
    target_length: TargetLength = None,
    config: SpecFile = None,
    sets: Sets = None,
    options: WriteOptions = None,  # --mode, --dtype, --overwrite, --no-verify, --allow-pickle, --trust-remote-code...
    revision: Revision = None,
    push_to_hub: PushToHub = None,
    private: Private = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --push-to-hub: write OUT, print what the push would upload, send nothing.")] = False,
    eval_suite: Annotated[str | None, typer.Option("--eval", help="Run this eval suite (e.g. quick) before/after; summary goes into the card.")] = None,
    eval_dir: Annotated[Path | None, typer.Option("--eval-dir", help="Where the eval report goes (default: OUT-eval beside OUT).")] = None,
) -> None:
    """Rescale a checkpoint's RoPE and write a verified checkpoint to OUT (a .gguf SOURCE writes a .gguf OUT)."""

    spec = build_spec(method, factor, target_length, config, sets or [])
    spec_args = {"revision": revision, "config": config, "method": method, "factor": factor,
                 "target_length": target_length, "sets": sets or []}
    try:
        _patch(source, output, spec, replace(options, hub_id=push_to_hub), revision=revision, private=private,
               dry_run=dry_run, eval_suite=eval_suite, eval_dir=eval_dir)
    except (AlreadyScaledError, ShorterWindowError, NoExtensionError) as exc:
        raise with_command(exc, source, output, spec_args) from None


def _patch(source: str, output: Path, spec: RopeSpec, options: WriteOptions, *, revision: str | None, private: bool,
           dry_run: bool, eval_suite: str | None, eval_dir: Path | None) -> None:
    """Plan SOURCE once, evaluate the plan if asked, write OUT with `options` (whose `hub_id` is --push-to-hub), then
    push it if asked."""
    from ..gguf.binary import is_gguf

    if not is_gguf(source):
        refuse_out_early(source, output, options.overwrite)  # before the heavy imports below
    from ..checkpoint import plan_checkpoint, write_checkpoint
    from ..sharing import HARD_LINK_NOTE, HARD_LINKED, tally

    if is_gguf(source):
        if options.hub_id or eval_suite or options.dtype or options.mode != "auto":
            fail("a .gguf SOURCE takes only --method/--factor/--target-length/--config/--set/--overwrite")
        from ..gguf.plan import plan_gguf_file
        from ..gguf.write import result_lines, write_gguf

        for line in result_lines(write_gguf(plan_gguf_file(source, spec), output, overwrite=options.overwrite)):
            if line.startswith("serve:  "):
                say_command("serve:  ", line.removeprefix("serve:  "))
            else:
                say(line, hang=HANG)
        return
    if options.hub_id:
        from ..hub import check_repo_id

        check_repo_id(options.hub_id, "--push-to-hub")  # before writing anything
    if dry_run and not options.hub_id:
        fail("--dry-run only applies to --push-to-hub")
    if eval_dir is not None and not eval_suite:
        fail("--eval-dir only applies with --eval SUITE")
    loaded, plan = plan_checkpoint(source, spec, output, options, revision=revision)  # the one plan
    if eval_suite:
        from ..eval.card_section import CardEval
        from ..eval.options import EvalOptions
        from ..eval.runner import run_eval
        from ..eval.suite import load_suite
        from ..eval.variants import Variant, variant_name

        report_dir = eval_dir or output.with_name(output.name + "-eval")
        _check_eval_dir(loaded.folder, output, report_dir)
        try:
            suite = load_suite(eval_suite)  # an unknown suite fails here, before any folder exists
        except FileNotFoundError as exc:
            raise CheckpointError(f"--eval {eval_suite!r}: {exc}") from None
        variant = Variant(variant_name(spec, set()), spec, plan=plan)  # evaluated with the plan OUT is written with
        records = run_eval(str(loaded.folder), [variant], suite, report_dir,
                           EvalOptions(memory_check=options.memory_check))
        options = replace(options, eval_summary=CardEval(records, suite=suite.name, smoke=suite.smoke))
    with Progress("patching", options.steps) as progress:
        result = write_checkpoint(loaded, plan, output, replace(options, on_step=progress.step))
    say(f"wrote {shell_path(result.out)} ({result.mode}: {tally(result.placed)}, {len(result.written)} written) in "
        f"{result.seconds:.2f} s; "
        f"{'verified with stock transformers (reload + a forward beyond the original length)' if result.verified else 'NOT verified (--no-verify)'}")
    if HARD_LINKED in result.placed.values():
        say(f"note: {HARD_LINK_NOTE}", hang="  ")
    say(plan.method.summary(plan))
    # What to do next, in three lines; every engine's command and where it serves identically are in the card.
    say_next_steps(result.out, result.serve)
    say(f"report: {shell_path(result.out / 'README.md')} (model card: the commands for transformers, vLLM, SGLang "
        f"and llama.cpp, and where each serves identically; `rope-extend engines {shell_path(result.out)}` rechecks "
        "it)",
        hang=HANG)
    if eval_suite:
        say(f"eval:   {shell_path(report_dir / 'report.md')}", hang=HANG)
    for warning in result.warnings:
        say(f"warning: {warning}", hang="  ", stream=console)
    if options.hub_id:
        from .push_cmd import publish

        publish(result.out, options.hub_id, private, dry_run, flag="--push-to-hub", written_now=True)


@app.command(
    epilog="Examples:\n\n  rope-extend show smollm2\n\n  rope-extend show ./my-model\n\n"
    "  rope-extend show meta-llama/Llama-3.1-8B --revision main"
)
def show(
    source: Annotated[str, typer.Argument(help="Local checkpoint folder, Hub repo id, or 'smollm2' (the demo model).")],
    revision: Revision = None,
) -> None:
    """Show the model's current RoPE setup: type, base, rotary dim, lengths, layer types, existing scheme."""
    from .. import compat
    from ..files import load_config
    from ..gguf.binary import is_gguf
    from ..gguf.info import info_lines, read_gguf_info

    if is_gguf(source):
        for line in info_lines(read_gguf_info(source)):
            say(line, hang="  ")
        return
    from ..hub import resolve_source
    from ..plan import check_rope_model

    config = compat.text_config(load_config(resolve_source(source, revision=revision, config_only=True)))
    check_rope_model(config)
    slots = compat.read_slots(config)
    marker = compat.read_marker(config)
    say(f"RoPE of {source} ({config.model_type})", hang="  ")
    # One "key: value" line per fact: nothing to cut at 80 columns, and values wrap instead of being truncated.
    for key, params in slots.items():
        other = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta", "factor", "original_max_position_embeddings")}
        rows = [
            ("rope_type", params["rope_type"]),
            ("rope_theta", f"{params['rope_theta']:g}"),
            ("rotary dim", str(compat.rotary_dim(config, params, key))),
            ("factor", _brief(params.get("factor", "-"))),
            ("original length", str(params.get("original_max_position_embeddings", config.max_position_embeddings))),
        ] + [(name, _brief(value)) for name, value in other.items()]
        say(f"layers {key or 'all'}:")
        for name, value in rows:
            say(f"{name + ':':<18} {value}", indent="  ", hang=" " * 21)
    say(f"max_position_embeddings: {config.max_position_embeddings}")
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        counts = {t: layer_types.count(t) for t in dict.fromkeys(layer_types)}
        say("layer types: " + ", ".join(f"{t} x{n}" for t, n in counts.items()), hang="  ")
    scaled = [k for k, p in slots.items() if p["rope_type"] != "default"]
    if marker:
        spec = marker.get("spec") if isinstance(marker.get("spec"), dict) else {}
        say(f"existing scheme: rope-extend {marker.get('method')} "
            f"({', '.join(f'{k}={_brief(v)}' for k, v in spec.items())})", hang="  ")
    elif scaled:
        say(f"existing scheme: {slots[scaled[0]]['rope_type']} (patching needs --set replace_existing=true)",
            hang="  ")
    else:
        say("existing scheme: none (plain RoPE)")


def _brief(value) -> str:
    """A value for people: numbers with %g, lists by length, mappings as k=v (never a raw Python repr)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return f"[{len(value)} values]"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_brief(v)}" for k, v in value.items()) or "-"
    return f"{value:g}" if isinstance(value, float) else str(value)
