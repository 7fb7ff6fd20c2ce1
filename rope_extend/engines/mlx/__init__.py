"""The MLX room (mlx-lm, what Mac users serve with): its port (`port`, pinned to mlx-lm 0.32.2 with the files read),
its rules and card routes (`engine`), and the real mlx-lm rope-extend runs (`run`, `worker`: run under the
environment's Python; `env`: its own virtualenv; `runs.json`: the runs recorded)."""

from ..registry import register
from .engine import MLX

register(MLX)
