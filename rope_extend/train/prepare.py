"""The first stage of a training run: everything validated, planned and tokenized before any model is loaded.

`prepare(spec)` reads SOURCE's config once, parses the RoPE spec once and makes the run's one `PatchPlan` (verified
against stock transformers here, before loading: the later stages apply and write this plan, they never plan
again), checks the numbers, paths, texts and held-out overlap, picks the window, chooses how the windows spread over
the processes (the run's one `parallelism.Parallelism`, which the later stages call) and splits the global batch. What
it returns, `Prepared`, is all the later stages read: `trainer` (the model and the Trainer), `finish` (writing
OUT) and `evaluation` (--eval-suite before and after).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from .. import compat, memory
from ..checkpoint import check_output_path
from ..errors import SpecError
from ..hub import resolve_source
from ..plan import check_rope_model
from ..source import Source, plan_source, read_source
from . import data, sharding
from .parallelism import Parallelism, choose
from .recipe import TrainSpec, batch_split, check_numbers, check_static, default_window


@dataclass
class Prepared:
    """Everything validated before any model is loaded."""

    spec: TrainSpec
    loaded: Source  # SOURCE: its folder and its config as read and as transformers loads it (read once, here)
    out: Path
    plan: object  # the run's one PatchPlan: applied to the model, written with the trained weights
    tokenizer: object
    corpus: data.Corpus
    window: int
    world: int
    accumulation: int
    global_windows: int
    fingerprint: str
    device: str  # "cuda" or "cpu": where the run trains (and --eval-suite evaluates)
    compute_dtype: str  # "float32", or the autocast dtype of mixed precision ("bfloat16", "float16")
    parallelism: Parallelism  # how the windows spread over the processes (`parallelism.choose`, once, here)

    @property
    def source(self) -> Path:
        return self.loaded.folder

    @property
    def config(self):
        return self.loaded.config

    @property
    def text(self):
        """The text model's config (multimodal configs nest it)."""
        return compat.text_config(self.config)

    @property
    def target(self) -> int:
        return self.plan.spec.target_length

    @property
    def pose(self) -> bool:
        return self.window < self.target

    @property
    def tokens_per_step(self) -> int:
        return self.global_windows * self.window

    @property
    def deepspeed(self) -> dict | None:
        """The DeepSpeed config rope-extend gives the run (None: none, or the accelerate launch's own)."""
        return self.parallelism.deepspeed

    @property
    def replicas(self) -> int:
        """Process groups that take different windows (data parallel): every process holding whole windows, or
        groups of processes sharing each window (`Parallelism.size`)."""
        return self.parallelism.replicas(self.world)

    @property
    def micro_tokens(self) -> int:
        """Tokens one process holds in one micro-batch."""
        return self.spec.optimisation.micro_batch * self.window // self.parallelism.size

    def batch_line(self) -> str:
        """How the global batch is split, for the progress line."""
        split = f"{self.parallelism.groups(self.replicas)} x {self.spec.optimisation.micro_batch} x {self.accumulation}"
        return f"global batch {self.global_windows} windows ({split})"


def world() -> tuple[int, int]:
    """(processes, this process's rank) as the launcher (torchrun, accelerate, deepspeed) set them."""
    return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def prepare(spec: TrainSpec) -> Prepared:
    """Validate the whole run, plan it and tokenize its data; refuses bad input in one line before any model is
    loaded."""
    check_numbers(spec)
    where = device()
    check_dtype_on_device(spec.compute.dtype, where)
    sharding.check_lora(spec.adapters.enabled and spec.adapters.train_embeddings_and_norms)
    rope = spec.rope_spec()
    check_static(rope)
    source = resolve_source(spec.source)
    out = check_output_path(source, Path(spec.output), spec.finish.overwrite)
    state = spec.state_dir()
    if source.resolve() in state.resolve().parents:
        raise ValueError(f"the training state folder {str(state)!r} would be inside SOURCE; choose another -o")
    loaded = read_source(spec.source, source)
    config = loaded.config
    text = compat.text_config(config)
    check_rope_model(text)
    plan = plan_source(loaded, rope)
    if plan.is_identity():
        raise SpecError(f"{rope.method} x{rope.factor:g} changes nothing on this model; choose a factor > 1",
                        field="factor", value=rope.factor)
    groups: list[tuple[str, list[data.Document], bool]] = []
    train_docs: list[data.Document] = []
    options = spec.data
    if options.texts:
        docs = data.read_text_files(options.texts)
        train_docs += docs
        groups += [(d.name, [d], True) for d in docs]
    if options.dataset is not None:
        name, rows = data.read_dataset(options.dataset, options.dataset_split, options.dataset_column)
        train_docs += rows
        groups.append((name, rows, False))
    for path in spec.evaluation.texts:
        p = Path(path).expanduser()
        if p.is_file():
            data.check_no_overlap(train_docs, p.read_text(encoding="utf-8", errors="replace"), str(path))
    if spec.evaluation.suite is not None:  # an unknown or invalid suite is refused here, and so is a suite text trained on
        from ..eval.suite import load_suite
        from ..eval.texts import load_text

        suite = load_suite(spec.evaluation.suite)
        for name in (suite.perplexity.texts if suite.perplexity is not None else []):
            data.check_no_overlap(train_docs, load_text(name), f"{name} (suite {suite.name})")
    target, original = plan.spec.target_length, plan.spec.original_max_position_embeddings
    window = options.window
    if window is None:
        window = default_window(target, original, memory.weights_bytes(source, "float32"), text.hidden_size,
                                text.num_hidden_layers, text.vocab_size, available_memory())
    if window > target:
        raise ValueError(f"--window {window} is longer than the target length {target}; use --window <= {target}")
    processes, _ = world()
    if processes == 1:  # a launch across processes shards or replicates by its own config: not estimated here
        check_memory(spec, source, text, window, where)
    parallelism = choose(spec.parallelism, spec.compute.dtype, text, window, processes, sharding.asked())
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(source)
    corpus = data.build_corpus(tokenizer, groups, window)
    global_windows = spec.optimisation.global_windows(window)
    replicas = parallelism.replicas(processes)
    accumulation = batch_split(global_windows, spec.optimisation.micro_batch, replicas, parallelism.groups(replicas))
    extra = {"window": window, "global_windows": global_windows, "data": [s.sha256 for s in corpus.sources],
             "source": _config_digest(source)}
    digest = spec.fingerprint(rope, {**extra, **parallelism.fingerprint()})
    from ..patch import verify_or_explain

    if plan.changed:  # stock transformers rebuilds the planned RoPE (as `patch_model(verify=True)`), before loading
        verify_or_explain(plan, text)
    dtype = spec.compute.dtype
    compute = "bfloat16" if trains_in_bf16(spec, where) else "float16" if dtype == "float16" else "float32"
    return Prepared(spec, loaded, out, plan, tokenizer, corpus, window, processes, accumulation,
                    global_windows, digest, where, compute, parallelism)


def check_dtype_on_device(dtype: str, where: str) -> None:
    """float16 trains only where accelerate runs fp16 mixed precision (autocast with its gradient scaler): CUDA and
    other accelerators. On the CPU accelerate turns it off without a word and the run would train in float32."""
    if dtype == "float16" and where == "cpu":
        raise SpecError("--dtype float16 needs a GPU: accelerate runs fp16 mixed precision (with its gradient scaler) "
                        "only on accelerators, and on the CPU the run would silently train in float32; use --dtype "
                        "bfloat16 (CPU autocast) or float32", field="dtype", value=dtype)


def trains_in_bf16(spec: TrainSpec, where: str) -> bool:
    """bf16 mixed precision: asked for, or `--dtype auto` on a GPU that has bf16."""
    import torch

    dtype = spec.compute.dtype
    return dtype == "bfloat16" or (dtype == "auto" and where == "cuda" and torch.cuda.is_bf16_supported())


def _config_digest(source: Path) -> str:
    return hashlib.sha256((source / "config.json").read_bytes()).hexdigest()[:16]


def available_memory() -> int:
    """Free memory where the run trains: the GPU's, else the machine's (`memory.available`)."""
    return memory.available("cuda" if device() == "cuda" else None).bytes


def check_memory(spec: TrainSpec, source: Path, text, window: int, where: str) -> None:
    """Refuse, before loading, a run whose float32 weights, gradients and AdamW state plus one micro-batch's
    activations (`memory.training_need`) exceed the memory where it trains; --lora and a shorter --window are
    offered with their numbers, --no-memory-check loads anyway."""
    dtype, adapters = spec.compute.dtype, spec.adapters
    compute = "bfloat16" if dtype == "bfloat16" or (dtype == "auto" and where == "cuda") else "float32"

    def need(lora: bool) -> memory.Need:
        return memory.training_need(source, text, window, spec.optimisation.micro_batch, compute_dtype=compute,
                                    checkpointing=spec.compute.gradient_checkpointing != "off",
                                    lora_r=adapters.r if lora else None,
                                    embeddings_and_norms=adapters.train_embeddings_and_norms)

    ways = memory.WaysOut(device="a GPU, or accelerate launch with FSDP or DeepSpeed ZeRO-3 offload",
                          length="--window {fits}: PoSE", offers=() if adapters.enabled else (
                              ("train adapters", "--lora", need(True)),))
    memory.check(spec.source, need(adapters.enabled), device="cuda" if where == "cuda" else None, ways=ways,
                 what="weights, gradients and optimizer state", skip=not spec.compute.memory_check)
