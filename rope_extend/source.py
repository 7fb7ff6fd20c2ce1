"""SOURCE, the model a command starts from, and the one plan of a spec on it.

A command that reads a checkpoint from disk (`patch`, `engines`, `train`) resolves SOURCE once (a folder, a Hub id
or `smollm2`: `hub.resolve_source`), reads its config.json once through the boundary checks (`files`), and plans
once (`plan_source`): the executors after it (the checkpoint writer, the card, the engines report) take that
`PatchPlan` and never plan or parse a spec again. A checkpoint rope-extend wrote carries its spec in its marker, so
its plan is made from that (`spec=None`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import compat, files
from .errors import CheckpointError
from .hub import resolve_source
from .plan import PatchPlan, plan_patch, recorded_spec
from .spec import RopeSpec


@dataclass(frozen=True)
class Source:
    """SOURCE resolved to a local folder, with its config.json as read (`raw`) and as transformers builds it."""

    given: str  # as the user named it (a Hub id, `smollm2`, a path): the card's base model is derived from it
    folder: Path
    raw: dict
    config: Any  # the transformers config of the whole model (`compat.text_config` gives its text part)


def load_source(source: str | os.PathLike, *, revision: str | None = None, trust_remote_code: bool = False,
                config_only: bool = False) -> Source:
    """SOURCE resolved and its config read (the weights only where `config_only` is False: a Hub id downloads
    them into the cache)."""
    return read_source(source, resolve_source(source, revision=revision, config_only=config_only), trust_remote_code)


def read_source(given: str | os.PathLike, folder: Path, trust_remote_code: bool = False) -> Source:
    """SOURCE's config.json, read once through the boundary checks, from the folder `hub.resolve_source` gave (a
    command that checks OUT against that folder first resolves, checks, then reads)."""
    return Source(str(given), folder, files.read_config(folder), files.load_config(folder, trust_remote_code))


def plan_source(source: Source, spec: RopeSpec | None) -> PatchPlan:
    """The plan of `spec` on SOURCE; with `spec=None`, the plan a rope-extend checkpoint records in its marker."""
    config = compat.text_config(source.config)
    if spec is None:
        spec = recorded_spec(config)
        if spec is None:
            raise CheckpointError(
                f"{source.given!r} was not written by rope-extend (config.json has no complete rope_extend marker); "
                "give the original model as SOURCE with --method and --factor instead"
            )
    return plan_patch(config, spec)
