"""Screenshot of the MLflow UI comparing the trials of a small study (the picture in the README).

Runs (or reuses) a small study, serves its store with ``mlflow server`` on 127.0.0.1, opens the
compare view of the study's complete trials in headless Chromium (Debian package ``chromium``),
picks the axes a person would look at first (compile.scope and the other knobs that varied, then
tokens_per_s, compile_s and objective), and saves the page as a PNG::

    apt-get install -y chromium
    python scripts/screenshot_mlflow.py                       # docs/mlflow-compare.png
    python scripts/screenshot_mlflow.py --root /tmp/shot      # reuse the study there if it exists

Chromium is driven over the DevTools protocol (a small WebSocket client below, standard library
only). If that fails, the page is captured with ``chromium --screenshot`` and the UI's default axes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from autocompile.study.mlflow_store import mlflow_server

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("screenshot_mlflow")

STUDY = ["+model=gpt2-tiny", "compile.backend=aot_eager", "workload.seq_len=[32]", "workload.batch_size=4",
         "measure.windows=3", "measure.window_steps=3", "study.seed=1", "study.prune=false"]  # more lines to compare
PARAMS = ("compile.scope", "amp.dtype", "ac.policy")
METRICS = ("compile_s", "tokens_per_s", "objective")
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
WIDTH, HEIGHT = 1600, 1000


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def compare_url(server: str) -> str:
    """The compare view of the latest study's complete trials (its parent's FINISHED children)."""
    api = server + "/api/2.0/mlflow"
    experiments = http_json(api + "/experiments/search", {"max_results": 100})["experiments"]
    ids = [e["experiment_id"] for e in experiments if e["name"].startswith("autocompile/")]
    parents = http_json(api + "/runs/search", {
        "experiment_ids": ids, "filter": "tags.`autocompile.run_dir` != ''", "order_by": ["attributes.start_time DESC"],
        "max_results": 1})["runs"]
    if not parents:
        raise RuntimeError("no autocompile study in this store")
    parent = parents[0]["info"]
    children = http_json(api + "/runs/search", {
        "experiment_ids": [parent["experiment_id"]],
        "filter": f"tags.`mlflow.parentRunId` = '{parent['run_id']}' and attributes.status = 'FINISHED'",
        "max_results": 100})["runs"]
    runs = [r["info"]["run_id"] for r in children]
    query = urllib.parse.urlencode({"runs": json.dumps(runs), "experiments": json.dumps([parent["experiment_id"]])},
                                   quote_via=urllib.parse.quote)
    return f"{server}/#/compare-runs?{query}"


class DevTools:
    """Just enough of a WebSocket client (RFC 6455, text frames) to speak the DevTools protocol."""

    def __init__(self, ws_url: str) -> None:
        parsed = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"DevTools handshake failed: {head[:200]!r}")
        self.next_id = 0

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            buf += chunk
        return buf

    def _send(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            message += self._recv_exact(n)
            if b0 & 0x80:  # FIN: the last fragment
                return message.decode()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 60) -> Any:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.3)
        raise TimeoutError(expression)

    def click(self, selector_js: str, timeout_s: float = 30) -> None:
        """Click the centre of the element ``selector_js`` evaluates to, as a mouse would."""
        box = self.wait_for(f"(() => {{ const e = {selector_js}; if (!e) return null; e.scrollIntoView({{block: "
                            "'center'}); const r = e.getBoundingClientRect(); return [r.x + r.width / 2, "
                            "r.y + r.height / 2]; })()", timeout_s)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
        time.sleep(0.3)

    def key(self, key: str, code: int) -> None:
        for kind in ("rawKeyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)


def by_text(tag: str, text: str) -> str:
    return (f"[...document.querySelectorAll('{tag}')].find(e => e.textContent.trim() === {json.dumps(text)} "
            "&& e.getClientRects().length)")


def choose(tools: DevTools, label: str, values: tuple[str, ...]) -> None:
    """Type each value into the multi-select after ``label`` ("Parameters:", "Metrics:") and take it."""
    select = (f"{by_text('div', label)}.nextElementSibling.querySelector('input')")
    for value in values:
        tools.click(select)
        tools.call("Input.insertText", text=value)
        time.sleep(0.4)
        tools.key("Enter", 13)
        time.sleep(0.3)
    tools.key("Escape", 27)
    tools.click("document.querySelector('h2') || document.body")  # focus away: no highlighted select in the shot


def screenshot_devtools(url: str, out: Path) -> None:
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chrome is None:
        raise RuntimeError("no chromium: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([chrome, *CHROME_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                 f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            ws = None
            for line in proc.stderr:
                found = re.search(r"DevTools listening on (ws://\S+)", line)
                if found:
                    ws = found.group(1)
                    break
            if ws is None:
                raise RuntimeError("chromium did not open its DevTools port")
            port = urllib.parse.urlparse(ws).port
            page = next(t for t in http_json(f"http://127.0.0.1:{port}/json/list") if t["type"] == "page")
            tools = DevTools(page["webSocketDebuggerUrl"])
            tools.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                       mobile=False)
            tools.call("Page.enable")
            tools.call("Page.navigate", url=url)
            tools.wait_for("document.querySelector('.pcp-plot .parcoords') !== null")
            # The assistant side panel takes a third of the page; close it when it is there.
            with contextlib.suppress(TimeoutError):
                tools.click("document.querySelector('button[aria-label=\"Close\"]')", timeout_s=3)
            tools.click("document.querySelector('[data-testid=\"clear-button\"]')")
            choose(tools, "Parameters:", PARAMS)
            choose(tools, "Metrics:", METRICS)
            tools.wait_for("document.querySelectorAll('.pcp-plot .parcoords .y-axis').length >= "
                           f"{len(PARAMS) + len(METRICS)}")
            time.sleep(1.5)
            shot = tools.call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def screenshot_plain(url: str, out: Path) -> None:
    """The page as it opens (the UI's default axes), no DevTools."""
    chrome = shutil.which("chromium") or "chromium"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chrome, *CHROME_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
                        "--virtual-time-budget=15000", f"--screenshot={out.resolve()}", url],
                       check=True, capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "autocompile-screenshot",
                        help="output_root of the study (reused when it already holds one)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "mlflow-compare.png")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    db = args.root.resolve() / "mlflow.db"
    if not db.exists():
        log.info("running a %d-trial study in %s (about a minute)", args.trials, args.root)
        subprocess.run([sys.executable, "-m", "autocompile", *STUDY, f"study.n_trials={args.trials}",
                        f"output_root={args.root.resolve()}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with mlflow_server(f"sqlite:///{db}") as server:
        url = compare_url(server)
        log.info("compare view: %s", url)
        try:
            screenshot_devtools(url, args.out)
        except Exception as exc:  # noqa: BLE001 - the default view is still worth a picture
            log.warning("DevTools capture failed (%s); plain screenshot with the default axes", exc)
            screenshot_plain(url, args.out)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
