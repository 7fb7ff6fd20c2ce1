"""The SGLang room: its port (`port`, pinned to the release it follows, with the files read), its rules and card
routes (`engine`), and the real SGLang rope-extend runs (`run`: its server; `env`: its own virtualenv; `runs.json`:
the runs recorded)."""

from ..registry import register
from .engine import SGLANG

register(SGLANG)
