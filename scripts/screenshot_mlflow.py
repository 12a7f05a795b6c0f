"""Screenshot of the MLflow UI comparing the trials of a small study with phases (the picture in the README).

Runs (or reuses) a small study with a confirmation and a verdict phase, serves its store with
``mlflow server`` on 127.0.0.1, and captures the compare view of the study's finished child runs
(search trials and the phases' repeats) with Chromium's own headless screenshot (Debian package
``chromium``): no browser driver, the page as the UI opens it, its default axes::

    apt-get install -y chromium
    python scripts/screenshot_mlflow.py                       # docs/mlflow-compare.png
    python scripts/screenshot_mlflow.py --root /tmp/shot      # reuse the study there if it exists
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from autocompile.report.tracking.mlflow_store import mlflow_server

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("screenshot_mlflow")

STUDY = ["+model=gpt2-tiny", "compile.backend=aot_eager", "workload.seq_len=[32]", "workload.batch_size=4",
         "measure.windows=3", "measure.window_steps=3", "study.seed=1", "study.prune=false",  # more lines to compare
         "study.confirm_top=2", "study.repeats=2", "study.verdicts=[amp.dtype,ac.policy]", "study.warm_start=false"]
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTH, HEIGHT = 1600, 1200
VIRTUAL_TIME_MS = 20000
"""How long the page may load and draw (virtual time: the capture is taken when it has run out)."""


def http_json(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def compare_url(server: str) -> str:
    """The compare view of the latest study's finished child runs (search trials and repeats)."""
    api = server + "/api/2.0/mlflow"
    experiments = http_json(api + "/experiments/search", {"max_results": 100})["experiments"]
    ids = [e["experiment_id"] for e in experiments if e["name"].startswith("autocompile/")]
    parents = http_json(api + "/runs/search", {
        "experiment_ids": ids, "filter": "tags.`autocompile.run_dir` != ''", "order_by": ["attributes.start_time DESC"],
        "max_results": 1})["runs"]
    if not parents:
        raise RuntimeError("no autocompile study in this store")
    parent = parents[0]["info"]
    study = {t["key"]: t["value"] for t in parents[0]["data"]["tags"]}["autocompile.study"]
    children = http_json(api + "/runs/search", {  # by the study's tag: repeats nest under their configuration's run
        "experiment_ids": [parent["experiment_id"]],
        "filter": f"tags.`autocompile.study` = '{study}' and attributes.status = 'FINISHED'",
        "max_results": 100})["runs"]
    runs = [r["info"]["run_id"] for r in children if r["info"]["run_id"] != parent["run_id"]]
    query = urllib.parse.urlencode({"runs": json.dumps(runs), "experiments": json.dumps([parent["experiment_id"]])},
                                   quote_via=urllib.parse.quote)
    return f"{server}/#/compare-runs?{query}"


def screenshot(url: str, out: Path) -> None:
    """Chromium's own ``--screenshot`` of ``url`` once the page has loaded and drawn."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chrome is None:
        raise RuntimeError("no chromium: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chrome, *CHROME_FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
                        f"--virtual-time-budget={VIRTUAL_TIME_MS}", f"--screenshot={out.resolve()}", url],
                       check=True, capture_output=True, timeout=180)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "autocompile-screenshot",
                        help="output_root of the study (reused when it already holds one)")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "mlflow-compare.png")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    db = args.root.resolve() / "mlflow.db"
    if not db.exists():
        log.info("running a %d-trial study with its phases in %s (a few minutes)", args.trials, args.root)
        subprocess.run([sys.executable, "-m", "autocompile", *STUDY, f"study.n_trials={args.trials}",
                        f"output_root={args.root.resolve()}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with mlflow_server(f"sqlite:///{db}") as server:
        url = compare_url(server)
        log.info("compare view: %s", url)
        screenshot(url, args.out)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
