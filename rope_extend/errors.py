"""Exceptions raised by rope-extend.

Every error subclasses a builtin so callers can catch `ValueError` / `OSError` without importing us, and every
message names the bad value, why it is bad, and how to fix it. The CLI prints `str(exc)` as one line and exits 2.
"""

from __future__ import annotations


class RopeExtendError(Exception):
    """Marker base class: every rope-extend error is also a builtin exception (see subclasses)."""


class SpecError(RopeExtendError, ValueError):
    """A scaling spec is invalid (unknown key or method, bad number, inconsistent factor/target...)."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


class UnsupportedModelError(RopeExtendError, ValueError):
    """The model has no rotary position embedding that rope-extend can rescale."""


class Suggests(RopeExtendError):
    """An error whose message suggests spec keys (a way forward), worded for the front end that prints it.

    `fix`: the spec keys of the way forward that really extends the model (e.g. {"target_length": 262144,
    "replace_existing": True}), for front ends that print a whole command. `compose(words)`: the message with every
    suggested set of keys written by `words(keys) -> str` (the plan writes `patch`'s flags; `eval` its --spec keys);
    `worded(words)` is the same error in those words."""

    fix: dict
    compose = None

    def _suggests(self, fix: dict | None, compose) -> None:
        self.fix = fix or {}
        self.compose = compose

    def worded(self, words):
        """This error with its suggestions written by `words` (itself when it has no composer)."""
        if self.compose is None:
            return self
        exc = self._copy(self.compose(words))
        exc._suggests(self.fix, self.compose)
        return exc

    def _copy(self, message: str):
        return type(self)(message, fix=self.fix)


class AlreadyScaledError(Suggests, ValueError):
    """The model already carries a RoPE scaling scheme and the spec would silently stack on top of it (`fix`,
    `worded`: see `Suggests`)."""

    def __init__(self, message: str, *, fix: dict | None = None, compose=None):
        super().__init__(message)
        self._suggests(fix, compose)


class ShorterWindowError(Suggests, SpecError):
    """The patch would write a checkpoint whose window is shorter than the source's, and the spec does not ask for
    that (`shorten_window: true`). `fix` as in `AlreadyScaledError`."""

    def __init__(self, message: str, *, fix: dict | None = None, value: object = None, compose=None):
        super().__init__(message, field="target_length", value=value)
        self._suggests(fix, compose)

    def _copy(self, message: str):
        return type(self)(message, fix=self.fix, value=self.value)


class NoExtensionError(Suggests, SpecError):
    """The spec reaches no further than the length it counts from (factor 1, a factor that rounds to it, a target
    equal to the original length): it would extend nothing (`plan._check_reach`). `fix` as in `AlreadyScaledError`."""

    def __init__(self, message: str, *, fix: dict | None = None, value: object = None, compose=None):
        super().__init__(message, field="factor", value=value)
        self._suggests(fix, compose)

    def _copy(self, message: str):
        return type(self)(message, fix=self.fix, value=self.value)


class ModelConfigError(RopeExtendError, ValueError):
    """The model's own config is at fault, not the patch: a model of it cannot run even before patching, or it runs
    only because its own RoPE ignores a field (`field`) that the scaled RoPE stock transformers builds applies."""

    def __init__(self, message: str, *, field: str | None = None, value: object = None):
        super().__init__(message)
        self.field = field
        self.value = value


class CheckpointError(RopeExtendError, ValueError):
    """A source checkpoint is missing, corrupt or unsafe, or an output location is not usable."""


class OutputNotReplaceableError(CheckpointError):
    """OUT exists and holds files rope-extend did not write and that are not a checkpoint's: replacing it (or
    writing into it) could lose them (`rope_extend.outputs.check_replaceable`)."""

    def __init__(self, message: str, *, path: str | None = None, files: list[str] | None = None):
        super().__init__(message)
        self.path = path
        self.files = files or []


class VerificationError(RopeExtendError, RuntimeError):
    """A written checkpoint does not load back to the frequencies rope-extend computed."""


class TrainedNotWrittenError(RopeExtendError, RuntimeError):
    """`rope-extend train` finished its optimizer steps but a later step (writing OUT, verifying it) failed. Nothing
    trained is lost: `checkpoint` (the last Trainer checkpoint in OUT.train-state) and, after a failed verification,
    `kept` (a loadable checkpoint beside OUT) hold the weights; rerunning the same command writes OUT from the
    checkpoint without training again."""

    def __init__(self, message: str, *, checkpoint: str | None = None, kept: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.kept = kept


class UnverifiedCheckpointError(VerificationError):
    """A fully written checkpoint failed verification and was kept (not deleted) in `kept`, its model card saying
    why; `reason` is the verification's own message (`checkpoint.WriteOptions(keep_unverified=...)`)."""

    def __init__(self, message: str, *, kept: str | None = None, reason: str = ""):
        super().__init__(message)
        self.kept = kept
        self.reason = reason


class ModelRunError(VerificationError):
    """Verification could not build or run a model of the config at all (as opposed to a mismatch of frequencies or
    outputs): `patch.verify_or_explain` then checks whether the unpatched config runs."""


def yaml_error_detail(exc: Exception) -> str:
    """Where and why PyYAML refused a text, as one line: `` at line 2, column 30: mapping values are not allowed
    here`` (the position when PyYAML knows it). Shared by the spec and suite loaders."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line, whatever PyYAML wrote
    return f"{where}: {problem}"
