"""The extender's HTTP/1.1 layer on a real socket: framing, keep-alive, bounds, timeouts, connection cap."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest
from extender_fixtures import fixture, http_client, make_service
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.extender.http import LARGE_BODY, LINGER_S
from app.extender.http_types import GRANULE, BodyBuffers

BODY = orjson.dumps(fixture("args_names_gctf.json"))
EXPECTED = [{"Host": "gpu-4090-1", "Score": 10}, {"Host": "gpu-m40-1", "Score": 7},
            {"Host": "gpu-k20-1", "Score": 4}, {"Host": "cpu-1", "Score": 0}]


def post(body: bytes, extra: str = "", path: str = "/prioritize") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer from the stream: status, headers (lower-case), body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return int(lines[0].split(" ")[1]), headers, body


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_keep_alive_pipelining_and_byte_by_byte_requests() -> None:
    async with http_client(make_service()) as client, connection(client.port) as (reader, writer):
        writer.write(post(BODY) + post(b"", path="/healthz").replace(b"POST", b"GET", 1) + post(BODY))
        answers = [await read_answer(reader) for _ in range(3)]
        assert [a[0] for a in answers] == [200, 200, 200]
        assert orjson.loads(answers[0][2]) == EXPECTED == orjson.loads(answers[2][2])
        assert orjson.loads(answers[1][2]) == {"status": "ok"} and "date" in answers[1][1]
        for byte in post(BODY):  # one byte per segment, on the same connection
            writer.write(bytes([byte]))
            await writer.drain()
        assert orjson.loads((await read_answer(reader))[2]) == EXPECTED


async def test_chunked_body_expect_continue_http10_and_head() -> None:
    async with http_client(make_service()) as client:
        async with connection(client.port) as (reader, writer):
            chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(BODY[i:i + 100]), BODY[i:i + 100])
                              for i in range(0, len(BODY), 100))
            writer.write(b"POST /prioritize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                         b"Expect: 100-continue\r\n\r\n")
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(chunks + b"0\r\nX-Trailer: t\r\n\r\n")
            status, _, body = await read_answer(reader)
            assert status == 200 and orjson.loads(body) == EXPECTED
        async with connection(client.port) as (reader, writer):
            writer.write(post(BODY).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
            status, headers, body = await read_answer(reader)
            assert status == 200 and headers["connection"] == "close" and await reader.read() == b""
        async with connection(client.port) as (reader, writer):
            writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 405") and b"Allow: GET" in head


@pytest.mark.parametrize(("raw", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
    (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 12x\r\n\r\n", 400),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 413),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
])
async def test_malformed_requests_get_an_error_with_a_message_and_close(raw: bytes, status: int) -> None:
    service = make_service()
    async with http_client(service) as client, connection(client.port) as (reader, writer):
        writer.write(raw)
        got, headers, body = await read_answer(reader)
        assert got == status and headers["connection"] == "close"
        assert orjson.loads(body)["Error"] and "Traceback" not in body.decode()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after the answer
        assert (await client.get("/healthz")).status == 200  # the server goes on serving
    assert f'rtt_extender_requests_total{{code="{status}",verb="other"}} 1.0' in service.metrics.render().decode()


async def test_slow_header_client_is_cut_off() -> None:
    service = make_service(header_timeout_s=0.3)
    async with http_client(service) as client, connection(client.port) as (reader, writer):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        answer = asyncio.ensure_future(reader.read())
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":  # one byte every 50 ms: never a whole header
            if answer.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)
        data = await asyncio.wait_for(answer, 5)
        assert data.startswith(b"HTTP/1.1 408") and b"request header not received within 0.3 s" in data
        # not before the timeout (it runs from the first byte, sent after t0); the upper bound only catches a hang
        assert 0.25 <= loop.time() - t0 < 10 * 0.3
        deadline = loop.time() + LINGER_S + 2  # the socket is released even though the client never closes it
        while client.server.http.connections:
            assert loop.time() < deadline
            await asyncio.sleep(0.05)


async def test_idle_connection_closed_and_connection_cap_answers_503() -> None:
    service = make_service(idle_timeout_s=0.3, max_connections=2)
    async with http_client(service, start=False) as client:
        async with connection(client.port) as (r1, _), connection(client.port) as (_, _):
            await asyncio.sleep(0.05)
            async with connection(client.port) as (r3, _):
                status, headers, body = await read_answer(r3)
                assert status == 503 and "too many connections (limit 2)" in orjson.loads(body)["Error"]
            assert await asyncio.wait_for(r1.read(), 5) == b""  # idle for 0.3 s: closed
        metrics = service.metrics.render().decode()
        assert "rtt_extender_connections_rejected_total 1.0" in metrics


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(junk=st.binary(max_size=300), cut=st.integers(min_value=1, max_value=400))
async def test_any_bytes_get_an_answer_or_a_close_and_the_server_keeps_serving(junk: bytes, cut: int) -> None:
    service = make_service(header_timeout_s=0.2)
    async with http_client(service, start=False) as client:
        async with connection(client.port) as (reader, writer):
            request = junk + post(BODY)
            writer.write(request[:cut])
            await writer.drain()
            writer.write(request[cut:])
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data == b"" or data.startswith(b"HTTP/1.1 ")
        assert (await client.get("/healthz")).status == 200


async def test_large_body_received_in_place_then_a_pipelined_request() -> None:
    args = fixture("args_nodes_gctf.json")
    template = args["Nodes"]["items"][0]
    items = [{**template, "metadata": {**template["metadata"], "name": f"n{i:04d}"}} for i in range(400)]
    big = orjson.dumps({**args, "Nodes": {**args["Nodes"], "items": items}})
    assert len(big) > LARGE_BODY
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, connection(client.port) as (reader, writer):
        data = post(big, path="/filter") + post(BODY)
        for i in range(0, len(data), 70_000):  # the body arrives in pieces; the next request right behind it
            writer.write(data[i:i + 70_000])
            await writer.drain()
        status, _, body = await read_answer(reader)
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(big)["Nodes"]  # unknown nodes pass
        status, _, body = await read_answer(reader)
        assert status == 200 and orjson.loads(body) == EXPECTED


def _big_args(n: int, prefix: str) -> bytes:
    args = fixture("args_nodes_gctf.json")
    template = args["Nodes"]["items"][0]
    items = [{**template, "metadata": {**template["metadata"], "name": f"{prefix}{i:04d}"}} for i in range(n)]
    return orjson.dumps({**args, "Nodes": {**args["Nodes"], "items": items}})


async def test_large_bodies_reuse_their_arrays_and_never_see_an_earlier_bodys_bytes() -> None:
    """Each large body is received into an array kept from an earlier one (no page faulted in again), and
    is read as sent: a shorter body after a longer one in the same array, different node names each time."""
    bodies = [_big_args(400, "a"), _big_args(350, "bb"), _big_args(390, "c")]
    assert all(len(b) > LARGE_BODY for b in bodies)
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, connection(client.port) as (reader, writer):
        pool = client.server.http.buffers
        taken: list[int] = []
        take = pool.take
        pool.take = lambda n: taken.append(id(a := take(n))) or a  # type: ignore[method-assign,func-returns-value]
        for big in bodies:
            writer.write(post(big, path="/filter"))
            status, _, body = await read_answer(reader)
            assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(big)["Nodes"]
            assert pool.kept == 1  # given back once answered
        assert len(taken) == 3 and len(set(taken)) == 1


async def test_a_body_still_referenced_after_its_answer_is_not_reused() -> None:
    """A handler that keeps (a view of) its body: the array is left alone, the next body gets another."""
    kept: list[object] = []
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, connection(client.port) as (reader, writer):
        inner = client.server.handler("POST", "/filter")

        def keeping(request):  # type: ignore[no-untyped-def]
            kept.append(request.body)
            return inner(request)

        client.server.route("POST", "/filter", "filter", keeping)
        first, second = _big_args(400, "a"), _big_args(400, "b")
        for big in (first, second):
            writer.write(post(big, path="/filter"))
            status, _, body = await read_answer(reader)
            assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(big)["Nodes"]
        assert client.server.http.buffers.kept == 0
        assert bytes(kept[0]) == first and bytes(kept[1]) == second  # neither overwritten


async def _send_part(writer: asyncio.StreamWriter, raw: bytes, part: slice) -> None:
    writer.write(raw[part])
    await writer.drain()


async def _not_answered(reader: asyncio.StreamReader, wait_s: float = 0.2) -> bool:
    try:
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
    except TimeoutError:
        return True
    return False


async def test_large_bodies_are_received_a_few_at_a_time_in_the_order_of_their_headers() -> None:
    """Two turns: the third and fourth bodies, although sent whole, are not read (nor answered) until the
    first is complete; then both are, while the second, still incomplete, keeps its turn."""
    bodies = [_big_args(400, p) for p in ("a", "bb", "c", "dd")]
    raws = [post(b, path="/filter") for b in bodies]
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, contextlib.AsyncExitStack() as stack:
        turns = client.server.http.turns
        turns.turns, turns.stall_s = 2, 30.0
        conns = [await stack.enter_async_context(connection(client.port)) for _ in raws]
        for (_, writer), raw in zip(conns, raws, strict=True):
            await _send_part(writer, raw, slice(0, len(raw) // 2))
            await asyncio.sleep(0.05)  # the headers arrive in this order
        assert (turns.receiving, turns.waiting) == (2, 2)
        for (_, writer), raw in list(zip(conns, raws, strict=True))[2:]:
            await _send_part(writer, raw, slice(len(raw) // 2, None))
        assert await _not_answered(conns[2][0]) and await _not_answered(conns[3][0], 0.01)
        await _send_part(conns[0][1], raws[0], slice(len(raws[0]) // 2, None))
        for k in (0, 2, 3):
            status, _, body = await read_answer(conns[k][0])
            assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(bodies[k])["Nodes"]
        assert (turns.receiving, turns.waiting) == (1, 0) and await _not_answered(conns[1][0], 0.01)
        await _send_part(conns[1][1], raws[1], slice(len(raws[1]) // 2, None))
        status, _, body = await read_answer(conns[1][0])
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(bodies[1])["Nodes"]
        assert (turns.receiving, turns.waiting) == (0, 0)
        assert client.server.http.buffers.kept <= 2  # four bodies, the arrays of two turns


async def test_a_stalled_body_loses_its_turn_and_is_still_received() -> None:
    first, second = _big_args(400, "a"), _big_args(400, "b")
    raw1, raw2 = post(first, path="/filter"), post(second, path="/filter")
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, \
            connection(client.port) as (r1, w1), connection(client.port) as (r2, w2):
        turns = client.server.http.turns
        turns.turns, turns.stall_s = 1, 0.1
        await _send_part(w1, raw1, slice(0, len(raw1) // 2))  # then nothing for a while
        await asyncio.sleep(0.05)
        await _send_part(w2, raw2, slice(None))
        status, _, body = await read_answer(r2)  # after the first stalled for 0.1 s
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(second)["Nodes"]
        await _send_part(w1, raw1, slice(len(raw1) // 2, None))
        status, _, body = await read_answer(r1)
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(first)["Nodes"]


async def test_the_wait_for_a_turn_is_not_counted_in_the_body_timeout() -> None:
    """One turn; the first two bodies never complete (408 each, 0.4 s after its turn); the third waited 0.8 s,
    twice the timeout, then has its own 0.4 s: sent 0.2 s after its turn, it is answered."""
    first, second, third = _big_args(400, "a"), _big_args(400, "b"), _big_args(400, "c")
    raws = [post(b, path="/filter") for b in (first, second, third)]
    service = make_service(max_body_bytes=4 << 20, read_timeout_s=0.4)
    async with http_client(service) as client, contextlib.AsyncExitStack() as stack:
        turns = client.server.http.turns
        turns.turns, turns.stall_s = 1, 30.0
        conns = [await stack.enter_async_context(connection(client.port)) for _ in raws]
        for (_, writer), raw in zip(conns, raws, strict=True):
            await _send_part(writer, raw, slice(0, len(raw) // 2))
            await asyncio.sleep(0.02)
        for reader, _ in conns[:2]:
            status, _, body = await read_answer(reader)
            assert status == 408 and "request body not received within 0.4 s" in orjson.loads(body)["Error"]
        await asyncio.sleep(0.2)
        await _send_part(conns[2][1], raws[2], slice(len(raws[2]) // 2, None))
        status, _, body = await read_answer(conns[2][0])
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(third)["Nodes"]


async def test_a_connection_closed_while_waiting_for_its_turn_gives_way_to_the_next() -> None:
    """A waiting connection is not read, so its close is seen when its turn comes: it is dropped then, and
    the one behind it is received."""
    big = _big_args(400, "a")
    raw = post(big, path="/filter")
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, connection(client.port) as (r1, w1), \
            connection(client.port) as (r3, w3):
        turns = client.server.http.turns
        turns.turns, turns.stall_s = 1, 30.0
        await _send_part(w1, raw, slice(0, len(raw) // 2))
        async with connection(client.port) as (_, w2):
            await _send_part(w2, raw, slice(0, len(raw) // 2))
            await asyncio.sleep(0.05)
        await _send_part(w3, raw, slice(None))
        await asyncio.sleep(0.05)
        assert (turns.receiving, turns.waiting) == (1, 2)
        await _send_part(w1, raw, slice(len(raw) // 2, None))
        assert (await read_answer(r1))[0] == 200
        status, _, body = await read_answer(r3)
        assert status == 200 and orjson.loads(body)["Nodes"] == orjson.loads(big)["Nodes"]
        assert (turns.receiving, turns.waiting) == (0, 0)


def test_body_arrays_have_room_for_a_slightly_longer_body_and_are_dropped_once_idle() -> None:
    now = [0.0]
    pool = BodyBuffers(max_bytes=40 << 20, idle_s=30.0, clock=lambda: now[0])
    a = pool.take(14_000_000)
    assert a.size >= 14_000_000 * 9 // 8 and a.size % GRANULE == 0
    pool.give(a)
    assert pool.take(14_000_100) is a  # the same NodeList for another pod: a few bytes longer
    arrays = [pool.take(14_000_000) for _ in range(3)]
    while arrays:
        pool.give(arrays.pop())  # (a caller's reference only, as the server gives them)
    assert pool.kept == 2 and pool.kept_bytes <= 40 << 20  # the third does not fit in max_bytes
    now[0] = 29.0
    assert pool.take(14_000_000) is not None and pool.kept == 1
    now[0] = 30.5
    pool.trim()
    assert pool.kept == 0  # not taken again within idle_s


async def test_idle_body_arrays_are_dropped_without_another_request() -> None:
    async with http_client(make_service(max_body_bytes=4 << 20)) as client, connection(client.port) as (reader, writer):
        pool = client.server.http.buffers
        pool.idle_s = 0.2
        writer.write(post(_big_args(400, "a"), path="/filter"))
        assert (await read_answer(reader))[0] == 200
        await asyncio.sleep(0.05)
        assert pool.kept == 1
        await asyncio.sleep(0.4)
        assert pool.kept == 0
