"""The trainer process: retrain-events in, feature selection + XGBoost off the event loop, champion/challenger
judgement, registry, model-updates out. See :mod:`app.trainer.service` and docs/feedback.md."""
