"""``LRUCache``: the one bounded in-memory cache of the package (pure Python; importable
with torch alone, like layers 1-2 that use it).

Keys must say everything the value depends on (grid, device, dtype, weights version, ...):
the cache only bounds the memory, it never checks staleness.
"""
import threading
from collections import OrderedDict
from typing import Callable, Hashable, Generic, TypeVar

__all__ = ["LRUCache"]

V = TypeVar("V")


class LRUCache(Generic[V]):
    """A thread-safe least-recently-used cache holding at most ``maxsize`` entries.

    >>> c = LRUCache(2); c.get_or_create("a", lambda: 1); c.get_or_create("b", lambda: 2)
    >>> c.get_or_create("c", lambda: 3); "a" in c   # "a" was the least recently used
    False
    """

    def __init__(self, maxsize: int):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"LRUCache maxsize must be an integer >= 1, got {maxsize!r}")
        self.maxsize = maxsize
        self._data: "OrderedDict[Hashable, V]" = OrderedDict()
        self._lock = threading.RLock()

    def get_or_create(self, key: Hashable, factory: Callable[[], V]) -> V:
        """The value of ``key``, made by ``factory()`` (and stored) when absent; the least
        recently used entries are dropped beyond ``maxsize``. ``factory`` runs outside the
        lock; when two threads make the same key at once, the first stored value wins."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = factory()
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            self._data[key] = value
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
            return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()

    def __repr__(self) -> str:
        return f"LRUCache(maxsize={self.maxsize}, size={len(self)})"
