"""A small W3C WebDriver client for the browser tests: Debian's chromium driven by
chromedriver over its HTTP protocol (no selenium needed, nothing mocked)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebDriverError(Exception):
    pass


class Browser:
    """One headless chromium session; close() ends it and its driver."""

    def __init__(self, width: int = 1280, height: int = 1000) -> None:
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="spool-chromium-")
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except (OSError, WebDriverError):
                if time.monotonic() > deadline:
                    self.driver.kill()
                    raise
                time.sleep(0.1)
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={self.profile}",
            f"--window-size={width},{height}",
        ]
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}
        value = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = f"/session/{value['sessionId']}"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as exc:
            raise WebDriverError(exc.read().decode(errors="replace")) from None

    def get(self, url: str) -> None:
        self._call("POST", f"{self.session}/url", {"url": url})

    def script(self, source: str, *args: Any) -> Any:
        return self._call("POST", f"{self.session}/execute/sync", {"script": source, "args": list(args)})

    def text(self, css: str) -> str:
        """The rendered text of the first element matching ``css``."""
        el = self._call("POST", f"{self.session}/element", {"using": "css selector", "value": css})
        ref = el[ELEMENT]
        return str(self._call("GET", f"{self.session}/element/{ref}/text"))

    def wait(self, source: str, timeout: float = 15.0) -> Any:
        """Poll a script until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.script(source)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for: {source}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", f"{self.session}/screenshot")))
        return path

    def close(self) -> None:
        try:
            self._call("DELETE", self.session)
        except (OSError, WebDriverError):
            pass
        finally:
            self.driver.terminate()
            try:
                self.driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
