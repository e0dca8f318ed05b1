"""Living under systemd: the notify protocol on a real datagram socket with a real
daemon, journald-style logs, and the units checked by systemd-analyze."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SPOOL, SPOOLD, minimal, run_cli, write_json

from spool.core.config import Config
from spoold.notify import Notifier, SystemdNotify, watchdog_interval

UNITS = Path(__file__).resolve().parents[1] / "systemd"


class NotifySocket:
    """What systemd does: a unix datagram socket that collects the daemon's messages."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.messages: list[list[str]] = []

    def wait_for(self, predicate: str, timeout: float = 30.0) -> list[str]:
        """Receive until a message has a line matching ``predicate`` (a regex); that message."""
        deadline = time.monotonic() + timeout
        for msg in self.messages:
            if any(re.fullmatch(predicate, line) for line in msg):
                return msg
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            msg = data.decode().split("\n")
            self.messages.append(msg)
            if any(re.fullmatch(predicate, line) for line in msg):
                return msg
        raise AssertionError(f"no {predicate!r} within {timeout} s; got {self.messages}")

    def wait_count(self, line: str, n: int, timeout: float = 30.0) -> None:
        """Receive until ``line`` has been received ``n`` times in all."""
        deadline = time.monotonic() + timeout
        while self.lines().count(line) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"{line!r} {self.lines().count(line)} times, not {n}, within {timeout} s"
            self.sock.settimeout(max(0.01, left))
            try:
                self.messages.append(self.sock.recv(4096).decode().split("\n"))
            except TimeoutError:
                continue

    def drain(self) -> None:
        """Receive whatever has arrived."""
        self.sock.settimeout(0)
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode().split("\n"))
        except BlockingIOError:
            pass

    def lines(self) -> list[str]:
        return [line for msg in self.messages for line in msg]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotifySocket]:
    address = (
        str(tmp_path / "notify.sock")
        if request.param == "path"
        else f"@spool-test-{os.getpid()}-{id(request)}"
    )
    s = NotifySocket(address)
    yield s
    s.close()


def test_daemon_speaks_the_notify_protocol(tree, assets, daemons, notify_socket):
    env = {"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": "400000"}
    d = daemons(tree, "sd", env=env)
    ready = notify_socket.wait_for(r"READY=1")
    assert any(re.fullmatch(r"STATUS=0 running, 0 pending, 0 failed; 0/2 slots busy here", x) for x in ready)
    notify_socket.wait_for(r"WATCHDOG=1")
    notify_socket.drain()
    # Pings keep coming at half of WATCHDOG_USEC (every 0.2 s): three more are waited for,
    # and they take at least two periods (not a storm).
    pings_before = notify_socket.lines().count("WATCHDOG=1")
    t0 = time.monotonic()
    notify_socket.wait_count("WATCHDOG=1", pings_before + 3)
    took = time.monotonic() - t0

    bad = write_json(
        tree.root.parent / "bad.json", minimal(assets, name="bad", output={"expect": {"width": 9}})
    )
    run_cli("submit", str(bad), spool=tree, check=True)
    notify_socket.wait_for(r"STATUS=0 running, 0 pending, 1 failed; 0/2 slots busy here")

    d.signal(signal.SIGTERM)
    stopping = notify_socket.wait_for(r"STOPPING=1")
    extend = [x for x in stopping if x.startswith("EXTEND_TIMEOUT_USEC=")]
    assert extend and int(extend[0].split("=")[1]) >= Config().daemon.stop_grace * 1e6
    notify_socket.wait_for(r"STATUS=stopped")
    assert d.wait() == 0
    lines = notify_socket.lines()
    assert lines.index("READY=1") < lines.index("STOPPING=1")
    # WATCHDOG_USEC 0.4 s: a ping every 0.2 s, at the loop's pace (poll_interval 0.2 s in tests).
    assert took >= 0.3, took


def test_no_notify_socket_means_no_notifications_and_no_harm(tree, daemons):
    d = daemons(tree, "plain", drain=True)
    assert d.wait() == 0
    assert "spoold.notify" not in d.output()


def test_notifier_sends_datagrams_and_survives_a_missing_socket(tmp_path):
    s = NotifySocket(str(tmp_path / "n.sock"))
    n = Notifier(s.address)
    assert n.send("READY=1", "STATUS=ok then")
    assert s.wait_for("READY=1") == ["READY=1", "STATUS=ok then"]
    with pytest.raises(ValueError):
        n.send("STATUS=two\nlines")
    s.close()
    os.unlink(s.address)
    assert n.send("WATCHDOG=1") is False  # logged once, never raised
    assert not Notifier(None).enabled and not Notifier("vsock:2:1").enabled


def test_watchdog_only_for_our_pid():
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({}) is None
    hook = SystemdNotify({"NOTIFY_SOCKET": "/nonexistent/socket"})
    assert hook.watchdog is None and hook.notifier.enabled


def test_logs_carry_syslog_priorities_under_journald(tree, assets, daemons):
    log = tree.root.parent / "journal.log"
    log.touch()
    st = log.stat()
    bad = write_json(
        tree.root.parent / "bad.json", minimal(assets, name="bad", output={"expect": {"width": 9}})
    )
    run_cli("submit", str(bad), spool=tree, check=True)
    env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}", "INVOCATION_ID": "0" * 32}
    assert daemons(tree, "jd", drain=True, env=env, log=log).wait() == 0
    lines = log.read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>", line) for line in lines), lines[:5]
    assert any(line.startswith("<4>spool.queue.execute: bad@1: failed at validate") for line in lines)
    assert any(line.startswith("<6>spoold: worker ") for line in lines)
    assert not any(re.match(r"<\d>\d{4}-\d\d-\d\d", line) for line in lines)  # journald adds the time


# -- the units ---------------------------------------------------------------------------------


def _unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string((UNITS / name).read_text())
    return cp


def test_worker_unit_fits_the_daemon():
    u = _unit("spoold@.service")["Service"]
    assert u["Type"] == "notify" and u["Restart"] == "on-failure" and u["KillMode"] == "mixed"
    assert "--worker %i" in u["ExecStart"] and "%i.env" in (UNITS / "spoold@.service").read_text()
    defaults = Config().daemon
    assert int(u["TimeoutStopSec"].rstrip("s")) >= defaults.stop_grace + 30
    assert int(u["WatchdogSec"]) >= 10 * defaults.poll_interval
    for key in ("ProtectSystem", "ReadWritePaths", "NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert key in u, key
    assert u["ProtectSystem"] == "strict"
    timer = _unit("spool-gc.timer")["Timer"]
    assert timer["Persistent"] == "true" and timer["OnCalendar"]
    assert "spool gc --spool ${SPOOL_DIR}" in _unit("spool-gc.service")["Service"]["ExecStart"]


def _verify(folder: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(folder / u) for u in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart exists: point it at this checkout's programs.
    for src in UNITS.iterdir():
        text = (
            src.read_text()
            .replace("/usr/local/bin/spoold", SPOOLD)
            .replace("/usr/local/bin/spool ", SPOOL + " ")
        )
        (tmp_path / src.name).write_text(text)
    units = ("spoold@render1.service", "spool-gc.service", "spool-gc.timer", "spool-serve.service")
    res = _verify(tmp_path, *units)
    assert res.returncode == 0, res.stderr
    ours = [line for line in res.stderr.splitlines() if str(tmp_path) in line or "spool" in line]
    assert ours == [], res.stderr
    # The check is not blind: a broken copy is reported.
    broken = (tmp_path / "spoold@.service").read_text().replace("WatchdogSec=60", "WatchdogSec=sixty")
    (tmp_path / "spoold@.service").write_text(broken)
    assert "sixty" in _verify(tmp_path, "spoold@render1.service").stderr
