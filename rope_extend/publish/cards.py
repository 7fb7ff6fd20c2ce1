"""The cards a push sends from memory (OUT is never written): OUT's card with its Serving section naming the repo,
the note of a folder pushed `--unverified`, and the card of a pushed GGUF file."""

from __future__ import annotations

import shlex

SERVING_HEADING = "\n## Serving\n\n"


def gguf_card(info, repo_id: str, file_name: str, why: str) -> str:
    """The card of a pushed GGUF: the Hub's gguf tag, what llama.cpp reads from its metadata (no local path), the
    note that rope-extend did not verify it, and the command that serves it from the repo."""
    scaling = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.scaling.items())
    rope_freqs = f"{len(info.rope_freqs)} factors" if info.rope_freqs is not None else "none"
    context = f" -c {info.context_length}" if info.context_length else ""
    return "\n".join([
        "---", "tags:", "- gguf", "- rope-scaling", "- long-context", "---", "",
        f"# {repo_id.split('/', 1)[1]}", "", UNVERIFIED_NOTE.format(why=why), "",
        f"`{file_name}`: {info.name or 'a model'} as one GGUF file for llama.cpp ({info.architecture}, "
        f"{info.tensor_count} tensors, {info.file_size / 1e6:.1f} MB).", "",
        "## What llama.cpp reads from it", "",
        f"- context_length: {info.context_length}",
        f"- rope.freq_base: {info.freq_base:.9g}",
        f"- rope.dimension_count: {info.rope_dim}",
        f"- rope.scaling: {scaling or 'none'}",
        f"- rope_freqs tensor: {rope_freqs}", "",
        "Read from the file's metadata by rope-extend (`rope-extend show FILE.gguf` prints the same).", "",
        "## Serving", "", "```bash",
        f"llama-server --hf-repo {repo_id} --hf-file {shlex.quote(file_name)}{context}", "```", "",
    ])


UNVERIFIED_NOTE = ("> **Not verified by rope-extend.** Pushed as it is with `rope-extend push --unverified`: {why}. "
                   "rope-extend vouches for none of these files.")


def unverified_card(text: str | None, name: str, why: str) -> str:
    """The card an unverified push sends: `text` (OUT's card; None: OUT has none, a title is made from `name`) with
    a note under its title (after the metadata block) saying rope-extend did not verify it and why."""
    note = UNVERIFIED_NOTE.format(why=why)
    if not text:
        return f"# {name}\n\n{note}\n"
    lines = text.split("\n")
    start = 0
    if lines and lines[0].strip() == "---":  # the metadata block the Hub reads stays first
        start = next((i + 1 for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
    title = next((i for i in range(start, len(lines)) if lines[i].startswith("# ")), None)
    at = title + 1 if title is not None else start
    return "\n".join(lines[:at] + ["", note, ""] + lines[at:])


def with_serving(text: str, serving: str) -> str:
    """`text` (a model card) with the body of its Serving section replaced by `serving`."""
    start = text.find(SERVING_HEADING)
    if start < 0:
        return text
    body = start + len(SERVING_HEADING)
    end = text.find("\n## ", body)
    end = len(text) if end < 0 else end
    return text[:body] + serving.strip() + "\n" + text[end:]
