"""The feedback loop of one worker: the component that registers it.

:func:`register_feedback` adds, on top of the node-features component (whose node windows it reads):

* :mod:`~app.streams.feedback_join` — task-completions ⨝ rtt-predictions, training-samples;
* :mod:`~app.streams.feedback_errors` — every error period: prediction-errors, DWA windows, drift and
  cold-start retrain-events;
* :mod:`~app.streams.feedback_weights` — every error period: node-weights, and the Redis cache;
* :mod:`~app.streams.feedback_models` — the models in use, hot-swapped on model-updates.

What they share, and its checkpoints, is :class:`~app.streams.feedback_state.FeedbackLoop`, one layer
below them all.
"""

from __future__ import annotations

import faust

from app.config import Settings
from app.contracts import contract
from app.drift.joinbuffer import JoinBuffer
from app.streams.context import context_of
from app.streams.feedback_errors import register_errors
from app.streams.feedback_join import register_join
from app.streams.feedback_models import ModelCache, follow_model_updates
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.feedback_table import feedback_table
from app.streams.feedback_weights import register_weights
from app.streams.node_features import node_features_of
from app.streams.timers import timer

HANDLE = "feedback"
TABLE_NAME = "feedback"


def register_feedback(app: faust.App, settings: Settings) -> FeedbackLoop:
    """Add the feedback loop to ``app`` (after the node-features component); returns its state."""
    ctx = context_of(app)
    options = FeedbackOptions.from_settings(settings)
    table = feedback_table(app, TABLE_NAME, ctx.ownership_topic, contract("task-completions").partitions)
    models = ModelCache(settings, metrics=ctx.metrics, health=ctx.health)
    loop = FeedbackLoop(settings, options, ctx.clock, node_features_of(app), models,
                        JoinBuffer(settings.join_ttl_s, options.join_max_entries, ctx.clock), table,
                        ctx.metrics, ctx.health)
    table.on_restore = loop.restore
    table.on_revoke = loop.revoke
    table.on_rewound = loop.rewrite
    table.on_stopping = loop.checkpoint
    loop.models.on_swap.append(loop.model_swapped)
    ctx.bounds.on_new_app.append(loop.app_heard)  # a retired app named again gets its models back
    loop.intake = register_join(app, loop)
    register_errors(app, loop)
    register_weights(app, loop)

    @app.task
    async def model_updates() -> None:
        await follow_model_updates(settings, loop.models)

    @timer(app, ctx.options.checkpoint_interval_s, "feedback-checkpoint")
    async def checkpoint() -> None:
        await loop.checkpoint()

    ctx.handles[HANDLE] = loop
    return loop
