"""An array that grows along one axis without copying at every append: the spare room behind
model.cache's "append the new positions".

`GrowingArray.concatenate(old, new)` is `np.concatenate([old, new], axis)` (tested equal, bit for
bit: tests/unit/test_growing_array.py), written into room an array of its own has left, so a
decode step that appends one position copies nothing; when the room runs out (or `old` is not
the array it last returned) it moves to a new array with room for a quarter more positions (at
least ROOM_LEAST). The positions before are never written again, so a view of them taken
earlier (a `LayerCache.first(n)` cache's) still holds them.
"""

from __future__ import annotations

import numpy as np

ROOM = 4  # an array with room has a quarter more positions (at least ROOM_LEAST) than it holds: an append
ROOM_LEAST = 64  # copies the cache now and then, not at every decode step (268 MB at 131072 in Kimi K2)


class GrowingArray:
    """One growing field: its own array with room, and the view of it last returned."""

    def __init__(self, axis: int):
        self.axis = axis
        self.own: np.ndarray | None = None  # the positions so far, and room after them
        self.view: np.ndarray | None = None  # own's first positions: what the last append returned

    def concatenate(self, old: np.ndarray | None, new: np.ndarray) -> np.ndarray:
        """np.concatenate([old, new], axis) (just `new` when old is None), in the room."""
        if old is None:
            return new
        axis = self.axis
        n, total = old.shape[axis], old.shape[axis] + new.shape[axis]
        if self.own is None or self.view is not old or self.own.shape[axis] < total:
            shape = list(old.shape)
            shape[axis] = total + max(ROOM_LEAST, total // ROOM)
            self.own = np.empty(shape, old.dtype)
            self.own[along(axis, 0, n)] = old
        self.own[along(axis, n, total)] = new
        self.view = self.own[along(axis, 0, total)]
        return self.view


def along(axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index of positions [start, stop) along `axis`."""
    return (slice(None),) * axis + (slice(start, stop),)
