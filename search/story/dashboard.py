"""``knobtune dashboard``: optuna-dashboard on a knobtune storage."""
from __future__ import annotations

import errno
import sys
from typing import TextIO

from knobtune.search.errors import UserError
from knobtune.search.storage import artifacts
from knobtune.search.storage.database import open_storage, redact


def serve(url: str, host: str = "127.0.0.1", port: int = 8080, err: TextIO = sys.stderr,
          artifacts_option: str | None = None) -> int:
    """Serve until interrupted, with the trials' artifacts when their directory exists. Binds to
    127.0.0.1 unless ``host`` says otherwise."""
    storage = open_storage(url)
    from optuna_dashboard import run_server

    directory = artifacts.resolve(url, artifacts_option)
    if directory is not None and not directory.is_dir():
        if artifacts_option is not None:
            raise UserError(f"--artifacts {directory}: no such directory")
        directory = None
    shown = f"[{host}]" if ":" in host else host
    err.write(f"knobtune: optuna-dashboard for {redact(url)} at http://{shown}:{port}/ (Ctrl-C stops it)\n")
    err.write(f"knobtune: trial artifacts from {directory}\n" if directory is not None else
              "knobtune: no trial artifacts to serve (name their directory with --artifacts DIR)\n")
    err.flush()
    try:
        run_server(storage, host=host, port=port,
                   artifact_store=artifacts.store(directory) if directory is not None else None)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is already in use; choose another with --port") from None
        raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass
    return 0
