"""Kafka plumbing shared by every process: the embedded broker, topic creation, producers."""
