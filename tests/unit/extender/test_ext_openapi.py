"""The OpenAPI document describes the running service: schemathesis finds no 5xx and no non-conformance."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import schemathesis
from extender_fixtures import make_service
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.extender.server import OPENAPI_PATH, ExtenderServer

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 25


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """The extender on a free port, served by its own event loop in a thread; stopped afterwards."""
    loop = asyncio.new_event_loop()
    service = make_service(max_body_bytes=64 * 1024)
    started = threading.Event()
    server: list[ExtenderServer] = []

    async def start() -> None:
        server.append(ExtenderServer(service))
        await server[0].listen("127.0.0.1", 0)
        await service.start()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield server[0].url
    finally:
        asyncio.run_coroutine_threadsafe(server[0].close(), loop).result(10)
        asyncio.run_coroutine_threadsafe(service.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_served_document_is_the_file(base_url: str) -> None:
    import requests

    assert requests.get(f"{base_url}/openapi.json", timeout=5).content == OPENAPI_PATH.read_bytes()


def test_schemathesis_finds_no_server_error_and_no_nonconformance(base_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /filter", "POST /prioritize", "GET /readyz"}
    calls = 0
    for op in operations:
        modes = [GenerationMode.POSITIVE]
        if op.method.upper() == "POST":
            modes.append(GenerationMode.NEGATIVE)  # wrong types, missing Pod, ...: must be a 4xx, never a 5xx
        for mode in modes:

            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case) -> None:
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=base_url, checks=CHECKS)

            check()
    assert calls >= 2 * EXAMPLES
