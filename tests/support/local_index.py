"""A package index on 127.0.0.1 (PEP 503 "simple" pages over a folder of wheels), served by
http.server in a thread: what an operator's mirror is to a sandboxed build."""
from __future__ import annotations

import functools
import http.server
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def local_index(wheels: Path, root: Path) -> Iterator[str]:
    """The index URL (`http://127.0.0.1:PORT/simple/`) of every wheel in `wheels`."""
    (root / "simple").mkdir(parents=True, exist_ok=True)
    for wheel in wheels.glob("*.whl"):
        project = root / "simple" / wheel.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).write_bytes(wheel.read_bytes())
        (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()
