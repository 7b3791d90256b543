"""Errors of the model layer: training, fast inference and the model registry.

Every error derives from :class:`ModelError`, itself an :class:`~app.errors.RttError`, so a caller can
catch the whole layer at once or one case precisely.

>>> issubclass(IntegrityError, RttError)
True
>>> str(NotEnoughSamplesError(3, 20))
'3 usable samples, at least 20 needed to train'
>>> str(NotEnoughSamplesError(2, 10, "samples left after holding out 18"))
'2 samples left after holding out 18, at least 10 needed to train'
>>> str(CurrentChangedError("gCTF:gpu", 7, 8))
"model 'gCTF:gpu': the current version is v8, not v7: nothing changed"
>>> str(CurrentChangedError("gCTF:gpu", 0, 1))
"model 'gCTF:gpu': the current version is v1, not none: nothing changed"
"""

from __future__ import annotations

from app.errors import RttError


class ModelError(RttError):
    """Base of every error of :mod:`app.model`."""


class TrainingError(ModelError, ValueError):
    """The training data cannot be used: mismatched shapes, wrong feature names, bad arguments."""


class NotEnoughSamplesError(TrainingError):
    """Too few usable rows to train (and hold some out)."""

    def __init__(self, n: int, needed: int, what: str = "usable samples") -> None:
        self.n = n
        self.needed = needed
        super().__init__(f"{n} {what}, at least {needed} needed to train")


class UnsupportedModelError(ModelError, ValueError):
    """A booster the fast predictor cannot evaluate (objective, multi-target, categorical splits, ...)."""


class ModelFormatError(ModelError, ValueError):
    """A blob or file that is not a readable XGBoost model."""


class RegistryError(ModelError):
    """The model registry cannot do what was asked (bad model key, nothing to roll back to, ...)."""


class RegistryUnavailableError(RegistryError):
    """The registry's store cannot be reached now (Redis down, restarting or timing out): try again later.

    A caller keeps what it has (the model in use) and retries with backoff; nothing is wrong with the
    model itself.
    """


class ModelNotFoundError(RegistryError, LookupError):
    """No such model key, version or current version in the registry."""

    def __init__(self, model_key: str, version: int | None = None, detail: str = "") -> None:
        self.model_key = model_key
        self.version = version
        what = f"model {model_key!r}" if version is None else f"model {model_key!r} version {version}"
        super().__init__(detail or f"{what} not found in the registry")


class CurrentChangedError(RegistryError):
    """A promotion refused because the key's current version is no longer the one it was decided against (another
    writer promoted, an operator rolled back): nothing was changed; decide again against the new current.

    ``expected`` is the version that had to be current (0: none), ``found`` the one that is (None: none).
    """

    def __init__(self, model_key: str, expected: int, found: int | None) -> None:
        self.model_key = model_key
        self.expected = expected
        self.found = found
        super().__init__(f"model {model_key!r}: the current version is {_named(found)}, not {_named(expected)}: "
                         "nothing changed")


def _named(version: int | None) -> str:
    return f"v{version}" if version else "none"


class IntegrityError(RegistryError):
    """A stored blob does not match the sha256 recorded with it (tampered or truncated)."""

    def __init__(self, model_key: str, version: int, expected: str, actual: str) -> None:
        self.model_key = model_key
        self.version = version
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"model {model_key!r} version {version}: sha256 {actual[:12]}... does not match the recorded "
            f"{expected[:12]}..., refusing to load it"
        )
