"""Give the heap pages a retrain freed back to the operating system.

A retrain allocates its dataset, the feature-selection matrices and XGBoost's quantile sketches, then frees
them. glibc's allocator keeps freed pages of its arenas mapped for later use, so the trainer's resident
memory stays at the peak of the largest retrain and wanders with the next one. ``malloc_trim(0)`` after each
retrain, and after the sample history of idle keys is dropped (``RTT_TRAINER_KEY_IDLE_S``), returns the free
pages at the top and inside every arena (glibc ≥ 2.8); elsewhere (musl, macOS) there is nothing to call and
this does nothing. What the history holds is counted apart (``rtt_trainer_samples``,
``rtt_trainer_history_bytes``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _trimmer() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn  # type: ignore[no-any-return]


_TRIM = _trimmer()


def release_freed_memory() -> bool:
    """Return freed heap pages to the OS; True when the C library could (glibc), False when it has no
    ``malloc_trim`` or nothing was released.

    >>> isinstance(release_freed_memory(), bool)
    True
    """
    if _TRIM is None:
        return False
    return bool(_TRIM(0))
