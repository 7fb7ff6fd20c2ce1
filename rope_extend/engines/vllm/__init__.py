"""The vLLM room: its port (`port`, pinned to the release it follows, with the files read), its rules and card routes
(`engine`), and the real vLLM rope-extend runs (`run`, `worker`, `env`: its own virtualenv; `runs.json`: the runs
recorded)."""

from ..registry import register
from .engine import VLLM

register(VLLM)
