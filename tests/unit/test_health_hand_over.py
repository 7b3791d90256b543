"""The worker's port, answered while it waits for Kafka at start, is handed to Faust's web server without a
request lost: the responder stops taking connections, answers those it took, and only then returns (the worker's
``asyncio.run`` ends right after, cancelling whatever is left); connections still in the backlog are the next
server's. Before, a scrape taken at the hand-over had its connection closed unanswered (``RemoteDisconnected``)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from app.health import answer_while_waiting

CLIENTS = 24


def _serve_after(held: socket.socket, stop: threading.Event) -> None:
    """What Faust's web server does with the held socket: serve on it, on an event loop of its own."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).strip():
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nafter\n")
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(answer, sock=held)
        while not stop.is_set():
            await asyncio.sleep(0.02)
        server.close()

    asyncio.run(main())


def test_no_request_is_dropped_across_the_hand_over():
    held = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = held.getsockname()[1]
    hand_over, done = threading.Event(), threading.Event()
    answers: dict[str, int] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:  # the worker's main thread: the wait, then the web server on the same socket
        async def wait() -> None:
            async with answer_while_waiting(held, lambda: "kafka: waiting"):
                await asyncio.to_thread(hand_over.wait)

        asyncio.run(wait())
        _serve_after(held, done)

    def client() -> None:  # a scrape that sends its request in two parts: some are in flight at the hand-over
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    time.sleep(0.03)
                    conn.sendall(b"\r\n")
                    got = b""
                    while chunk := conn.recv(4096):
                        got += chunk
            except OSError as exc:
                got = f"{type(exc).__name__}: {exc}".encode()
            with lock:
                if got.startswith(b"HTTP/1.1 200"):
                    key = "after" if got.endswith(b"after\n") else "waiting"
                    answers[key] = answers.get(key, 0) + 1
                else:
                    errors.append(got.decode(errors="replace") or "closed unanswered")

    serving = threading.Thread(target=worker, daemon=True)
    serving.start()
    clients = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    time.sleep(1.0)
    hand_over.set()
    for c in clients:
        c.join(30)
    done.set()
    serving.join(10)
    held.close()
    assert answers.get("waiting") and answers.get("after"), answers  # both servers answered
    assert not errors, f"{len(errors)} of {len(errors) + sum(answers.values())} requests dropped: {errors[:3]}"
