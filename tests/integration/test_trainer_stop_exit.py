"""``rttsched trainer`` stopped while a training runs exits within its stop's bound, on the real broker.

A training runs in the trainer's executor thread, where no cancel reaches it. The stop gave up on it after
``stop_timeout_s`` (20 s), but the process did not exit: Python's exit joins the executor's thread, so the trainer ran
on until the training ended or the pod's SIGKILL came; and a second SIGTERM or Ctrl-C during the stop did nothing.
Now the stop names what it left behind in one WARNING and the process exits at once with code 1 (as the worker does
when its stop outlasts its bound); a second signal during the stop ends it at once with one line, code 128 + its
number.

The second signal's line must not keep the trainer from exiting when nothing reads its output any more (a
``rttsched trainer | tee log`` whose ``tee`` the first Ctrl-C ended): writing it failed on the closed pipe, the signal
handler raised (asyncio's ``Exception in callback`` with a traceback) and the trainer ran on to its stop's bound.

The slow training is the real trainer's, its ``_train_and_judge`` (what runs in the thread) replaced by a sleep in
the child process, and its stop's bound shortened to keep the test short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import Settings
from app.contracts import encode
from app.kafka.embedded import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KEY = "gCTF:gpu"
TRAINING_S = 120.0  # the slow training: far past the stop's bound
START_S = 90.0  # the trainer's imports, start and first retrain, on a loaded machine

# the trainer, its training a sleep that says (on stderr) when it starts; argv: the training's seconds, the stop's bound
SLOW_TRAINER = """
import sys, time
from app.trainer.service import TrainerService

def slow(self, *args, **kwargs):
    print("slow training started", file=sys.stderr, flush=True)
    time.sleep(float(sys.argv[1]))
    raise RuntimeError("the slow training ended")

TrainerService._train_and_judge = slow
TrainerService.__init__.__kwdefaults__["stop_timeout_s"] = float(sys.argv[2])
from app.cli.main import main
sys.exit(main(["trainer"]))
"""


class Trainer:
    """The slow trainer in a session of its own, its output (stdout and stderr) gathered by a thread; with
    ``stdout_gone``, its stderr only: its stdout is a pipe nothing reads, closed at once."""

    def __init__(self, settings: Settings, stop_timeout_s: float, tmp_path: Path, *, stdout_gone: bool = False) -> None:
        env = {**os.environ, "RTT_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
               "RTT_TOPIC_PREFIX": settings.topic_prefix, "RTT_MODELS_DIR": str(tmp_path / "models"),
               "RTT_METRICS_PORT": str(free_port()), "RTT_METRICS_HOST": "127.0.0.1", "RTT_TRAINER_CPUS": "",
               "PYTHONUNBUFFERED": "1"}
        env.pop("REDIS_URL", None)
        self.proc = subprocess.Popen([sys.executable, "-c", SLOW_TRAINER, str(TRAINING_S), str(stop_timeout_s)],
                                     env=env, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE if stdout_gone else subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._output = self.proc.stderr if stdout_gone else self.proc.stdout
        if stdout_gone:
            assert self.proc.stdout is not None
            self.proc.stdout.close()  # what the trainer writes there now fails: the pipe's reader is gone
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._output is not None
        for line in self._output:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for_training(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if "slow training started" in self.text:
                return
            time.sleep(0.05)
        raise AssertionError(f"the training did not start (exit code {self.proc.poll()}):\n{self.text}")

    def exited_within(self, timeout_s: float) -> tuple[int | None, float]:
        """Its exit code (None if it still ran after ``timeout_s``) and how long it took."""
        t0 = time.monotonic()
        try:
            code: int | None = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t0
        self._reader.join(5.0)
        return code, took

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def samples(n: int) -> list[bytes]:
    return [encode("training-samples", {
        "model_key": KEY, "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 3}", "node_class": "gpu",
        "gpu_model": "Tesla M40", "started_ts": time.time() - 600 + i, "rtt_ms": 300.0 + 7.0 * (i % 11),
        "input_size_mb": 64.0, "window_s": 30.0,
        "features": {"nvidia_smi_utilization_gpu__mean": float(i % 11), "cpu_iowait__mean": float(i % 5)},
    }) for i in range(n)]


def produce(settings: Settings, topic: str, values: list[bytes]) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
        await producer.start()
        try:
            for value in values:
                await producer.send(settings.topic(topic), value, key=KEY.encode())
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(send())


@pytest.fixture
def training(kafka_settings: Settings) -> Settings:
    """The broker holds samples enough for a retrain of KEY, and an event asking for it."""
    produce(kafka_settings, "training-samples", samples(60))
    produce(kafka_settings, "retrain-events", [encode("retrain-events", {
        "model_key": KEY, "reason": "manual", "cumulative_error": 0.7, "threshold": 0.5, "ts": time.time(),
        "onset_ts": None})])
    return kafka_settings


@contextlib.contextmanager
def training_trainer(settings: Settings, stop_timeout_s: float, tmp_path: Path, **kw: bool) -> Iterator[Trainer]:
    """The slow trainer, once its training has started; killed (its session) on the way out if still running."""
    trainer = Trainer(settings, stop_timeout_s, tmp_path, **kw)
    try:
        trainer.wait_for_training()
        yield trainer
    finally:
        trainer.end()


@pytest.fixture
def slow_trainer(training: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Trainer]:
    with training_trainer(training, request.param, tmp_path) as trainer:
        yield trainer


@pytest.mark.parametrize("slow_trainer", [2.0], indirect=True)
def test_sigterm_during_a_training_exits_within_the_stops_bound(slow_trainer: Trainer) -> None:
    slow_trainer.proc.send_signal(signal.SIGTERM)
    code, took = slow_trainer.exited_within(20.0)
    assert code is not None, f"still running 20 s after SIGTERM (stop bound 2 s):\n{slow_trainer.text}"
    assert code == 1 and took < 12.0, f"exit code {code} after {took:.1f} s:\n{slow_trainer.text}"
    warnings = [ln for ln in slow_trainer.lines if " WARNING " in ln]
    assert len(warnings) == 1, slow_trainer.text
    # the one WARNING names the training; a client slow to stop on a loaded machine may be named before it
    assert "trainer stopping: " in warnings[0], warnings
    assert "the training or registry call running in its thread did not end within" in warnings[0], warnings
    assert "Traceback" not in slow_trainer.text and "trainer stopped" not in slow_trainer.text, slow_trainer.text


@pytest.mark.parametrize("slow_trainer", [60.0], indirect=True)
@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_during_the_stop_exits_at_once(slow_trainer: Trainer, second: signal.Signals) -> None:
    slow_trainer.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the stop is under way, waiting for the training (60 s at most)
    assert slow_trainer.proc.poll() is None, slow_trainer.text
    said_before = len(slow_trainer.lines)
    slow_trainer.proc.send_signal(second)
    code, took = slow_trainer.exited_within(15.0)
    assert code is not None, f"still running 15 s after a second signal:\n{slow_trainer.text}"
    assert code == 128 + second.value and took < 5.0, f"exit code {code} after {took:.1f} s:\n{slow_trainer.text}"
    line = f"trainer: {second.name} during the stop (SIGTERM): exiting at once without finishing it\n"
    assert slow_trainer.lines[said_before:][-1:] == [line] and slow_trainer.lines.count(line) == 1, slow_trainer.text
    assert "Traceback" not in slow_trainer.text, slow_trainer.text


def test_a_second_signal_exits_at_once_when_nothing_reads_the_output(training: Settings, tmp_path: Path) -> None:
    with training_trainer(training, 60.0, tmp_path, stdout_gone=True) as trainer:
        trainer.proc.send_signal(signal.SIGINT)  # the Ctrl-C that also ended the output's reader
        time.sleep(1.0)  # the stop is under way, waiting for the training (60 s at most)
        assert trainer.proc.poll() is None, trainer.text
        trainer.proc.send_signal(signal.SIGINT)
        code, took = trainer.exited_within(15.0)
        assert code is not None, f"still running 15 s after a second signal, its stdout gone:\n{trainer.text}"
        assert code == 130 and took < 5.0, f"exit code {code} after {took:.1f} s:\n{trainer.text}"
        assert "Traceback" not in trainer.text and "Exception in callback" not in trainer.text, trainer.text
