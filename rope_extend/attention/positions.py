"""The one form positions take between the runtime and the attention paths: `Positions`.

An attention call's queries are always the last of its keys (transformers appends a call's new keys to the cache
before attention), so one object describes both: the positions of the `count` keys.

- Known on the host (`ids` is None): row b's key j sits at position `first + j - pads[b]`; the keys j < pads[b] are
  the row's left padding (`pads` empty: none, every row alike). Nothing is read from a device to use them, so a
  decoding step that knows its positions this way synchronises nothing. The runtime knows them this way while the
  model derives its own positions (the caller passed none) and inside `generate()`.
- A tensor (`ids`, [B or 1, count]): a caller's own position ids (packed sequences, custom offsets), read where a
  path needs them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Positions:
    count: int  # keys (the call's queries are the last of them)
    first: int = 0  # host form: the position of a row's first key after its padding
    pads: tuple[int, ...] = ()  # host form: left padding per row (empty: none)
    ids: torch.Tensor | None = None  # tensor form: [B or 1, count]

    @classmethod
    def of(cls, ids: torch.Tensor) -> Positions:
        """The tensor form: key positions [B or 1, n] (the queries are the last of them)."""
        return cls(int(ids.shape[-1]), ids=ids)

    @property
    def known(self) -> bool:
        """Known on the host: nothing to read from a device."""
        return self.ids is None

    @property
    def padded(self) -> bool:
        return any(self.pads)

    def bounds(self) -> tuple[int, int]:
        """(lowest, highest) position of a real key over every row: Python ints of the host form; the tensor form
        reads them from the device."""
        if self.ids is None:
            return self.first, self.first + self.count - 1 - min(self.pads, default=0)
        return int(self.ids.min()), int(self.ids.max())

    def key_ids(self, device=None) -> torch.Tensor:
        """The tensor form's ids, or the host form's as a tensor [B or 1, count] (a padding key at a position
        below `first`: the mask hides it)."""
        if self.ids is not None:
            return self.ids if device is None else self.ids.to(device)
        ids = torch.arange(self.first, self.first + self.count, device=device)[None]
        if self.padded:
            ids = ids - torch.tensor(self.pads, device=device)[:, None]
        return ids

    def query_ids(self, n_q: int, device=None) -> torch.Tensor:
        """The last n_q keys' positions [B or 1, n_q]."""
        return self.key_ids(device)[:, self.count - n_q :]

    def row(self, b: int) -> Positions:
        """Row b's keys after its padding, every one real: the host form without padding."""
        return Positions(self.count - self.pads[b], self.first)

    def grown(self, n: int) -> Positions:
        """The host form with n more keys (a forward's new tokens)."""
        return replace(self, count=self.count + n)

    def prefix(self, n: int) -> Positions:
        """The first n keys' positions (a cropped cache)."""
        if self.ids is not None:
            return Positions.of(self.ids[:, :n])
        return replace(self, count=n)
