"""A push plan executed: the Hub reached, the plan's files sent (`upload.send`), and every failure worded as one
line that says why, that OUT is kept as it was (a push writes nothing into it), and, where a retry can fix it, the
command that resumes."""

from __future__ import annotations

from .. import hub
from ..errors import CheckpointError
from .plan import PushPlan
from .upload import retryable, send, status_of, without_urls


def check_reachable(plan: PushPlan) -> None:
    """One TCP connection to the Hub (3 s) instead of huggingface_hub's retries; a retry can fix this one."""
    if not hub.hub_reachable():
        raise CheckpointError(f"cannot push to {plan.repo_id!r}: the Hub ({hub.endpoint()}) is unreachable"
                              f"{plan.kept(retry=True)}")


def push(plan: PushPlan, token: str, report=None, retry=None) -> bool | None:
    """Create the repo (`exist_ok`: a later push adds a commit) and send exactly `plan.selection.sent`: the large
    files as LFS objects the Hub does not hold yet, then one commit of every file (`publish.upload`; the card
    from `plan.card` when it names the repo); returns the visibility the Hub reports afterwards (True: private; None:
    not reported). Sets `plan.url`. Every failure is one CheckpointError line saying why, OUT is kept as it was (a
    push writes nothing into it), and a failure a retry can fix offers the command that resumes; Ctrl-C raises
    `upload.PushInterrupted`, whose line says the same."""
    from huggingface_hub import HfApi

    refusal = plan.selection.refusal()
    if refusal is not None:
        raise refusal
    try:
        transfer = send(plan, token, report, retry)
    except (KeyboardInterrupt, SystemExit, MemoryError, CheckpointError):
        raise
    except Exception as exc:  # huggingface_hub's HTTP errors, connection errors and timeouts of its HTTP client
        status = status_of(exc)
        if status is None:
            reason = without_urls(" ".join(str(exc).split()))[:200]
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed ({type(exc).__name__}"
                                  f"{': ' + reason if reason else ''}){plan.kept(retry=retryable(exc))}") from None
        said = without_urls(" ".join(str(getattr(exc, "server_message", None) or "").split()))[:200]
        said = f" ({said})" if said else ""
        if status in (401, 403):
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP {status}{said}; check that the token "
                                  f"has write access to it{plan.kept()}") from None
        if status == 404:
            raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP 404{said}; check the repo id and that "
                                  f"the token may write to it{plan.kept()}") from None
        raise CheckpointError(f"pushing to {plan.repo_id!r} failed: HTTP {status}{said}"
                              f"{plan.kept(retry=retryable(exc))}") from None
    plan.url = transfer.url or f"{hub.endpoint()}/{plan.repo_id}"
    plan.transfer = transfer
    try:
        return bool(HfApi(token=token).repo_info(plan.repo_id, repo_type="model").private)
    except Exception:  # the push is done; only the visibility report is missing
        return None
