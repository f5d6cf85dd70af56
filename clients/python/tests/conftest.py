"""Fixtures: a real svc server per test, started from ``SVC_BIN``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from svc_client import Client

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]


def svc_binary() -> Path:
    configured = os.environ.get("SVC_BIN")
    path = Path(configured) if configured else REPO_ROOT / "target" / "release" / "svc"
    if not path.is_file():
        pytest.fail(f"svc binary not found at {path}: build it or set SVC_BIN", pytrace=False)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SvcServer:
    """One ``svc serve`` process on a fixed port and data dir (restartable)."""

    def __init__(self, binary: Path, data_dir: Path, log_path: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(self.binary), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"svc exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/svc/v1/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"svc did not become healthy:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM: a graceful stop (the second signal makes it quick)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def svc_bin() -> Path:
    return svc_binary()


@pytest.fixture
def server(svc_bin: Path, tmp_path: Path) -> Iterator[SvcServer]:
    srv = SvcServer(svc_bin, tmp_path / "data", tmp_path / "svc.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server: SvcServer) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c
