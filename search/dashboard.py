"""``knobtune dashboard``: optuna-dashboard on a knobtune storage."""
from __future__ import annotations

import errno
import sys
from typing import TextIO

from search.errors import UserError
from search.storage import open_storage, redact


def serve(url: str, host: str = "127.0.0.1", port: int = 8080, err: TextIO = sys.stderr) -> int:
    """Serve until interrupted. Binds to 127.0.0.1 unless ``host`` says otherwise."""
    storage = open_storage(url)
    from optuna_dashboard import run_server

    shown = f"[{host}]" if ":" in host else host
    err.write(f"knobtune: optuna-dashboard for {redact(url)} at http://{shown}:{port}/ (Ctrl-C stops it)\n")
    err.flush()
    try:
        run_server(storage, host=host, port=port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is already in use; choose another with --port") from None
        raise UserError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass
    return 0
