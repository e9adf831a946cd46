"""The `chronicler` command: serve, backup (and, as the product grows, install-extension, import-chat)."""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import sys
from pathlib import Path
from typing import IO, Sequence

# Before numpy/torch load anywhere: one BLAS thread (two pools on two cores double query latency).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .settings import SettingsError, load_settings  # noqa: E402

LOCK_FILE = "chronicler.lock"


class AlreadyRunning(Exception):
    """Another sidecar holds this data folder."""


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Hold an exclusive lock on the data folder for the life of the process (one sidecar per store)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_FILE, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise AlreadyRunning(f"Another Chronicler sidecar ({holder}) is already using {data_dir}. "
                             "Stop it first, or start this one with another --data-dir.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def serve(args: argparse.Namespace) -> int:
    import waitress

    from .app import create_app
    from .security import ensure_token

    settings = load_settings({"host": args.host, "port": args.port, "data_dir": args.data_dir})
    try:
        lock = lock_data_dir(settings.data_path)
    except AlreadyRunning as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 3
    app = create_app(settings)
    server = waitress.create_server(app, host=settings.host, port=settings.port,
                                    threads=settings.threads, ident="chronicler",
                                    max_request_body_size=max(settings.max_import_bytes,
                                                              settings.max_messages_body_bytes))
    port = int(server.effective_port)  # type: ignore[attr-defined]  (waitress gives a str)
    app.extensions["chronicler_guard"].ports = {port}
    _, token_path = ensure_token(settings)
    print(f"Chronicler sidecar listening on http://{settings.host}:{port}/v1", flush=True)
    print(f"Data folder: {settings.data_path}", flush=True)
    print("Bearer token: " + (f"in {token_path}" if token_path else "from CHRONICLER_TOKEN / settings"),
          flush=True)
    print(f"Allowed origins: {', '.join(settings.origins)}", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        app.extensions["chronicler"].db.close()
        lock.close()
    return 0


def backup(args: argparse.Namespace) -> int:
    """Copy the store to --out (default DATA_DIR/backups/…), safely while a sidecar is serving."""
    from .backup import BackupError, backup_database, default_backup_path

    settings = load_settings({"data_dir": args.data_dir})
    out = Path(args.out).expanduser() if args.out else default_backup_path(settings.data_path)
    try:
        result = backup_database(settings.data_path / settings.db_file, out.resolve(),
                                 int(settings.busy_timeout_ms))
    except BackupError as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {table}" for table, n in result.counts.items())
    print(f"Backup written to {result.path} ({result.bytes} bytes: {counts}); integrity check ok.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronicler", description="Long-campaign memory for SillyTavern.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the sidecar's HTTP API")
    p_serve.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p_serve.add_argument("--port", type=int, help="port (default 7711)")
    p_serve.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_serve.set_defaults(func=serve)
    p_backup = sub.add_parser("backup", help="copy the store to a file (safe while serving)")
    p_backup.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_backup.add_argument("--out", help="backup file (default: DATA_DIR/backups/chronicler-<time>.sqlite3)")
    p_backup.set_defaults(func=backup)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SettingsError as exc:
        print(f"chronicler: bad setting: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
