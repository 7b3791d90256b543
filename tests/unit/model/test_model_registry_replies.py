"""How the Redis store reads an error reply: one code after what a pipeline names before it, shared by
``wrong_type`` (a key set by hand to another kind of value) and ``refuses_writes`` (a Redis to wait out)."""

from __future__ import annotations

import pytest
import redis

from app.registry.redis_store import _reply_code, refuses_writes, wrong_type

PIPELINE = "Command # 2 (SET rttsched:model:k:blob:3 ...) of pipeline caused error: "
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


@pytest.mark.parametrize(("exc", "code", "is_wrong_type", "refuses"), [
    (redis.ResponseError(WRONGTYPE), "WRONGTYPE", True, False),
    (redis.ResponseError(PIPELINE + WRONGTYPE), "WRONGTYPE", True, False),
    (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots"), "MISCONF", False, True),
    (redis.ResponseError(PIPELINE + "MISCONF Errors writing to the AOF file"), "MISCONF", False, True),
    (redis.ResponseError(PIPELINE + "NOREPLICAS Not enough good replicas to write."), "NOREPLICAS", False, True),
    (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "command", False,
     True),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), "You", False, True),
    (redis.ResponseError("NOPERM this user has no permissions to run the 'get' command"), "NOPERM", False, False),
    (redis.ResponseError("ERR the message names WRONGTYPE later caused error: x"), "x", False, False),
    (redis.ResponseError(""), "", False, False),
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), "", False, False),
    (ValueError("WRONGTYPE"), "", False, False),
])
def test_one_reply_code_serves_both_readers(exc: BaseException, code: str, is_wrong_type: bool,
                                            refuses: bool) -> None:
    assert _reply_code(exc) == code
    assert wrong_type(exc) is is_wrong_type
    assert refuses_writes(exc) is refuses
