"""The MLflow tracking store: is it usable (one line saying why not, before any trial), who may
create it (a file lock: tuners started together would race through SQLite's schema migrations),
and a local server over a store for tests and scripts."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from autocompile.config.settings import ConfigError
from autocompile.study.records.optuna_store import file_lock

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# Short causes of an unusable store, found in the (long, nested) exception text.
CAUSES = ("Connection refused", "Name or service not known", "Temporary failure in name resolution",
          "timed out", "No route to host", "certificate verify failed", "unable to open database file",
          "readonly database", "Permission denied")


@contextlib.contextmanager
def quick_http() -> Iterator[None]:
    """MLflow retries HTTP calls for minutes by default; a reachability check should answer in seconds."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    found = next((c for c in CAUSES if c.lower() in text.lower()), None)
    if found:
        return found.lower()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= 160 else first[:157] + "..."


def sqlite_path(uri: str) -> Path | None:
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def store_lock(uri: str) -> contextlib.AbstractContextManager[None]:
    """Held while a SQLite store is opened: the first opening creates and migrates its schema, and
    MLflow's migrations fail when two processes run them at once ("duplicate column name")."""
    db = sqlite_path(uri)
    return file_lock(db.with_name(db.name + ".lock")) if db is not None else contextlib.nullcontext()


def open_client(uri: str) -> MlflowClient:
    """An MlflowClient whose store exists (the client opens its store when made, creating a new one)."""
    from mlflow.tracking import MlflowClient

    with store_lock(uri):
        return MlflowClient(tracking_uri=uri)


def check_store(uri: str) -> None:
    """Fail before any trial when the tracking store cannot be reached or written (one-line ConfigError)."""
    for chatty in ("alembic", "mlflow.store.db.utils"):  # schema creation of a new store, at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        db = sqlite_path(uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
                raise PermissionError("Permission denied")
        with quick_http():
            open_client(uri).search_experiments(max_results=1)
    except Exception as exc:
        what = "is not reachable" if uri.startswith(("http://", "https://")) else "cannot be opened for writing"
        raise ConfigError(f"tracking.uri={uri} {what} ({_cause(exc)}): start the MLflow server, fix tracking.uri, "
                          "or set tracking.enabled=false") from exc


@contextlib.contextmanager
def mlflow_server(store_uri: str, log_path: Path | None = None, start_timeout_s: float = 120) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 (a free port) for a store, until the block ends; yields its URL.

    The server and its uvicorn worker run in their own session, ended together (``kill_tree``).
    """
    import subprocess
    import sys
    import urllib.request

    from autocompile.trial.launcher import free_port, kill_tree

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path or os.devnull, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri,
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + start_timeout_s
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=2).read()
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError(f"mlflow server for {store_uri} did not start on port {port}") from None
                    time.sleep(0.5)
            yield url
        finally:
            kill_tree(proc)  # a graceful uvicorn shutdown can take seconds: after 5 s, nothing to save


def artifact_location(uri: str, name: str) -> str | None:
    """Next to a SQLite store (MLflow's default would be ./mlruns under whatever the working directory is);
    a server chooses its own."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.resolve().parent / "mlartifacts" / re.sub(r"[^\w./-]", "_", name)).as_uri()
