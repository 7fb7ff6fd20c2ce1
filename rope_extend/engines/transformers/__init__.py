"""The transformers room: the reference engine, run as a library (`probes`, `hf_probe`) with its rules (`engine`)."""

from ..registry import register
from .engine import TRANSFORMERS

register(TRANSFORMERS)
