"""The model registry: versioned XGBoost blobs (UBJ or JSON, never pickle) with sha256 and a current pointer.

It sits above the pure model layer (:mod:`app.model` trains and evaluates; it stores nothing) because its
production store talks to Redis: :mod:`~app.registry.base` (records, the store seam, retention),
:mod:`~app.registry.directory` and :mod:`~app.registry.redis_store` (the two stores),
:mod:`~app.registry.store` (which store a process opens; a verified predictor from it).
"""
