"""Topic contracts: the files in ``topics/`` are the single source of truth for every topic.

Code never restates a topic's schema, partitions or cleanup policy: it asks :func:`load_contracts`.
"""

from app.contracts.codec import decode, encode, validate
from app.contracts.loader import TOPIC_NAMES, TopicContract, contract, load_contracts, topics_dir

__all__ = ["TOPIC_NAMES", "TopicContract", "contract", "decode", "encode", "load_contracts", "topics_dir", "validate"]
