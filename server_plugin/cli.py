"""The `chronicler` command: serve, backup, export, import, import-chat."""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Sequence

# Before numpy/torch load anywhere: one BLAS thread (two pools on two cores double query latency).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .settings import SettingsError, load_settings  # noqa: E402

LOCK_FILE = "chronicler.lock"
# Windows: the byte the lock takes (far past the "pid N" text, which another process must still read).
WINDOWS_LOCK_OFFSET = 2**30
# Written by the SillyTavern server plugin while its sidecar listens (st_plugin/src/config.js).
CONNECTION_FILE = "sidecar.json"


def plugin_sidecar(data_dir: Path) -> dict[str, Any] | None:
    """Where the server plugin's sidecar listens ({url, port, token, ...}), or None."""
    import json

    try:
        data = json.loads((data_dir / CONNECTION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str) or not isinstance(data.get("token"), str):
        return None
    return data


def store_folder(data_dir: Path, user: str | None) -> Path:
    """A store's folder: DATA_DIR itself, or DATA_DIR/users/<user> for the server plugin's sidecar
    (one store per SillyTavern user; the default user's when `user` is None and that layout is there)."""
    from .stores import DEFAULT_USER, HANDLE, USERS_FOLDER

    if user is None and not (data_dir / USERS_FOLDER).is_dir():
        return data_dir
    handle = user or DEFAULT_USER
    if not HANDLE.fullmatch(handle):
        raise SettingsError(f"--user {handle!r} is not a SillyTavern user handle")
    return data_dir / USERS_FOLDER / handle


class AlreadyRunning(Exception):
    """Another sidecar holds this data folder."""


def _try_lock(handle: IO[str], system: str = os.name) -> bool:
    """Take an exclusive, non-blocking lock on an open file; False when another process holds it.

    POSIX: flock on the whole file. Windows has no fcntl: msvcrt locks one byte far past the text
    (a locked byte cannot be read by another process there, and the holder's pid must stay
    readable); the lock is the process's, and the OS drops it when the process dies, as flock's is."""
    try:
        if system == "nt":
            import msvcrt

            # msvcrt.locking locks from the descriptor's position: move the descriptor itself there.
            os.lseek(handle.fileno(), WINDOWS_LOCK_OFFSET, os.SEEK_SET)
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _lock_holder(handle: IO[str]) -> str:
    """Who holds the lock, as it wrote itself down ("pid N")."""
    try:
        handle.seek(0)
        return handle.read().strip() or "another process"
    except OSError:
        return "another process"


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Hold an exclusive lock on the data folder for the life of the process (one sidecar per store)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_FILE, "a+", encoding="utf-8")
    if not _try_lock(handle):
        holder = _lock_holder(handle)
        handle.close()
        raise AlreadyRunning(f"Another Chronicler sidecar ({holder}) is already using {data_dir}. "
                             "Stop it first, or start this one with another --data-dir.")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def exit_with_parent(grace_seconds: float = 10.0) -> threading.Thread:
    """Leave when stdin reaches its end: the server plugin that started us holds its other end,
    and the OS closes it when that process dies, however it dies (SIGKILL too, on every OS).

    The main thread is interrupted (so the stores close as on Ctrl-C); if it has not left after
    `grace_seconds`, the process ends anyway.
    """
    def watch() -> None:
        try:
            while sys.stdin.buffer.read(65536):
                pass
        except (OSError, ValueError):
            pass
        logging.getLogger("chronicler").warning("the process that started this sidecar is gone: stopping")
        _thread.interrupt_main()
        time.sleep(grace_seconds)
        os._exit(0)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


# mallopt's parameter for the number of arenas (glibc's malloc.h).
M_ARENA_MAX = -8


def limit_malloc_arenas(count: int) -> bool:
    """At most `count` glibc malloc arenas from now on (0: glibc's own limit, 8 per core).

    glibc gives each new thread that allocates an arena of its own, and an arena keeps the largest
    temporaries its threads ever held. A search at 100,000 messages holds tens of MB of them, and
    it runs on whichever of the request threads took it, so the sidecar's resident memory stepped
    up as more of those threads had served one (bench/README.md: ~120 MB at 100,000 messages).
    Called before the server's threads start. False where malloc is not glibc's (macOS, Windows,
    musl) or the call fails: nothing changes there."""
    if count <= 0 or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's alone: another libc's mallopt takes other numbers
        return bool(libc.mallopt(M_ARENA_MAX, int(count)))
    except (OSError, AttributeError):
        return False


def _stop_on_sigterm() -> None:
    """SIGTERM (the plugin's exit(), a service manager) stops like Ctrl-C: the stores close."""
    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def serve(args: argparse.Namespace) -> int:
    import waitress

    from .app import create_app
    from .settings import ensure_token

    settings = load_settings({"host": args.host, "port": args.port, "data_dir": args.data_dir})
    limit_malloc_arenas(settings.malloc_arenas)
    try:
        lock = lock_data_dir(settings.data_path)
    except AlreadyRunning as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 3
    if args.exit_with_stdin:
        exit_with_parent()
    _stop_on_sigterm()
    app = create_app(settings, per_user=args.per_user)
    server = waitress.create_server(app, host=settings.host, port=settings.port,
                                    threads=settings.threads, ident="chronicler",
                                    max_request_body_size=max(settings.max_import_bytes,
                                                              settings.max_messages_body_bytes,
                                                              settings.max_store_import_bytes))
    port = int(server.effective_port)  # type: ignore[attr-defined]  (waitress gives a str)
    app.extensions["chronicler_guard"].ports = {port}
    _, token_path = ensure_token(settings)
    print(f"Chronicler sidecar listening on http://{settings.host}:{port}/v1", flush=True)
    print(f"Data folder: {settings.data_path}", flush=True)
    print("Bearer token: " + (f"in {token_path}" if token_path else "from CHRONICLER_TOKEN / settings"),
          flush=True)
    print(f"Allowed origins: {', '.join(settings.origins)}", flush=True)
    if args.per_user:
        print(f"One store per SillyTavern user, in {settings.data_path / 'users'}", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        app.extensions["chronicler_stores"].close_all()
        lock.close()
    return 0


def install_extension(args: argparse.Namespace) -> int:
    """Install the extension (and the server plugin) into SillyTavern and connect it to this sidecar."""
    from .sillytavern.install import InstallError
    from .sillytavern.install import install_extension as install

    if not args.sillytavern and not args.data_root:
        print("chronicler: give --sillytavern ST_DIR (or --data-root DATA_DIR with --no-plugin)", file=sys.stderr)
        return 2
    settings = load_settings({"data_dir": args.data_dir})
    plugin = bool(args.sillytavern) and not args.no_plugin
    try:
        result = install(settings, sillytavern=Path(args.sillytavern) if args.sillytavern else None,
                         data_root=Path(args.data_root) if args.data_root else None,
                         user=args.user, link=args.link, plugin=plugin,
                         st_config=Path(args.st_config) if args.st_config else None,
                         allow_node_modules=args.allow_node_modules,
                         **({"source": Path(args.source)} if args.source else {}))
    except InstallError as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 1
    how = "Linked" if result.linked else "Copied"
    print(f"{how} the extension to {result.destination}")
    if result.plugin is not None:
        print(f"Copied the server plugin to {result.plugin} (it starts this sidecar: data in {settings.data_path}, "
              f"log in {settings.data_path / 'sidecar.log'})")
        for change in result.config_changes or ["SillyTavern's config.yaml already had enableServerPlugins: true"]:
            print(f"Changed {change}" if result.config_changes else change)
        print(f"Wrote {result.config_path} (the extension uses SillyTavern's {result.sidecar_url} route)")
        print("Next: restart SillyTavern. It starts the sidecar itself; Chronicler is in the Extensions panel.")
        return 0
    print(f"Wrote {result.config_path} (sidecar {result.sidecar_url} and its token; the extension "
          "reads it when its own settings are empty)")
    if result.origins_added:
        print(f"Allowed {', '.join(result.origins_added)} in {result.origins_file}")
    elif result.origins_file:
        print(f"SillyTavern's origins were already allowed in {result.origins_file}")
    for note in result.notes:
        print(f"Note: {note}")
    print("Next: start the sidecar with `chronicler serve` (restart it if it is running, so it reads "
          "the allowed origins), then reload SillyTavern's page. Chronicler is in the Extensions panel.")
    return 0


def backup(args: argparse.Namespace) -> int:
    """Copy the store to --out (default DATA_DIR/backups/…), safely while a sidecar is serving."""
    from .store.backup import BackupError, backup_database, default_backup_path

    settings = load_settings({"data_dir": args.data_dir})
    folder = store_folder(settings.data_path, args.user)
    out = Path(args.out).expanduser() if args.out else default_backup_path(folder)
    try:
        result = backup_database(folder / settings.db_file, out.resolve(),
                                 busy_timeout_ms=settings.busy_timeout_ms)
    except BackupError as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {table}" for table, n in result.counts.items())
    print(f"Backup written to {result.path} ({result.bytes} bytes: {counts}); integrity check ok.")
    return 0


def _offline_store(data_dir: str | None, create: bool) -> tuple[Any, Any, IO[str]]:
    """Settings, the open (migrated when `create`) database and the data folder's lock, for the
    commands that work on the store without a running sidecar. Raises AlreadyRunning."""
    from .app import open_store

    settings = load_settings({"data_dir": data_dir})
    db_path = settings.data_path / settings.db_file
    if not create and not db_path.is_file():
        raise FileNotFoundError(f"There is no Chronicler database at {db_path}.")
    lock = lock_data_dir(settings.data_path)
    return settings, open_store(db_path, settings, migrate=create), lock


def export_cmd(args: argparse.Namespace) -> int:
    """Write the whole store as one JSON document, streamed (offline: holds the data folder's lock)."""
    from .store import migrations, portable

    try:
        _, db, lock = _offline_store(args.data_dir, create=False)
    except (AlreadyRunning, FileNotFoundError) as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, AlreadyRunning) else 1
    try:
        size = portable.write_file(portable.export_chunks(db, vectors=not args.no_vectors),
                                   Path(args.out).expanduser().resolve())
        with db.read() as conn:  # the data folder is locked: the rows just written
            known = [t for t in portable.tables(conn) if not (args.no_vectors and t.vectors)]
            counts = portable.data_counts(conn, known, frozenset())  # the rows the document holds
        numbers = migrations.applied(db)
    finally:
        db.close()
        lock.close()
    print(f"Exported to {args.out} ({size} bytes, format {portable.FORMAT} v{portable.FORMAT_VERSION},"
          f" migrations {numbers}{', without vectors' if args.no_vectors else ''}): "
          + ", ".join(f"{n} {name}" for name, n in sorted(counts.items())))
    return 0


def import_checks() -> Any:
    """What every concept checks of an imported store, for an import without a running sidecar."""
    from .app import wire
    from .hooks import Hooks
    from .jobs.queue import JobKinds

    hooks = Hooks()
    wire(JobKinds(), hooks)
    return hooks.store_importing.send


def import_cmd(args: argparse.Namespace) -> int:
    """Load an export into the store: all of it in one transaction, or nothing (offline)."""
    import json

    from .errors import ChroniclerError
    from .retrieval import docs, reembed
    from .store import portable

    if args.replace and not args.yes:
        print("chronicler: --replace deletes everything in the store first; add --yes to confirm.",
              file=sys.stderr)
        return 2
    try:
        document = json.loads(Path(args.file).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"chronicler: cannot read {args.file}: {exc}", file=sys.stderr)
        return 1
    try:
        _, db, lock = _offline_store(args.data_dir, create=True)
    except AlreadyRunning as exc:
        print(f"chronicler: {exc} (or import over HTTP: POST /v1/import)", file=sys.stderr)
        return 3
    try:
        result = portable.import_store(db, document, "replace" if args.replace else "empty",
                                       confirm_replace=bool(args.replace and args.yes),
                                       check=import_checks(), finish=docs.analyse_pending,
                                       placeholders=reembed.without_vectors)
    except ChroniclerError as exc:
        print(f"chronicler: {exc.message}", file=sys.stderr)
        for detail in exc.details[:10]:
            print(f"  {detail}", file=sys.stderr)
        return 1
    finally:
        db.close()
        lock.close()
    print("Imported: " + ", ".join(f"{n} {name}" for name, n in sorted(result["imported"].items()) if n)
          + (f" (replaced: {result['replaced']})" if result["replaced"] else ""))
    if "vectors_pending" in result:
        print(f"The document had no vectors: {result['vectors_pending']} rows are embedded in the background "
              "when the sidecar starts (progress: GET /v1/health, reembed); search answers meanwhile.")
    return 0


def import_chat(args: argparse.Namespace) -> int:
    """Feed a SillyTavern chat file through the pipeline: offline on the data folder (its lock
    held, jobs run here), or into a running sidecar with --url/--token. Resumable: a rerun skips
    what is stored."""
    from .sillytavern import chat_file

    try:
        chat = chat_file.read_chat_file(Path(args.file).expanduser())
    except (OSError, chat_file.ChatFileError) as exc:
        print(f"chronicler: {exc}", file=sys.stderr)
        return 1
    plan = chat_file.plan(chat, args.chat_id, args.character_id or [], args.user_id)
    for name, guess in plan.guessed.items():
        print(f"note: {name!r} has no --character-id and no original_avatar; using {guess!r}",
              file=sys.stderr)
    progress = not args.no_progress
    if args.url:
        url, token = _online_target(args)
        if not token:
            print("chronicler: --url needs --token (or CHRONICLER_TOKEN); none was found in the "
                  f"data folder's {CONNECTION_FILE} or token file either", file=sys.stderr)
            return 2
        report = chat_file.run(plan, chat_file.HttpSink(url, token, user=args.user), args.batch_size,
                               progress, args.wait)
    else:
        from .api.schemas import default_schemas
        from .app import build_services

        settings = load_settings({"data_dir": args.data_dir, "worker_enabled": False})
        try:
            lock = lock_data_dir(settings.data_path)
        except AlreadyRunning as exc:
            print(f"chronicler: {exc} (or import into it over HTTP: --url, --token)", file=sys.stderr)
            return 3
        svc = build_services(settings)
        try:
            svc.embedder.wait(settings.embedder_wait_seconds)
            sink = chat_file.LocalSink(svc, default_schemas().validate)
            report = chat_file.run(plan, sink, args.batch_size, progress)
        finally:
            svc.db.close()
            lock.close()
    print(f"Imported {plan.chat_id!r}: {report.inserted} new messages ({report.already} were already "
          f"stored, {plan.skipped_hidden} hidden skipped, {report.total} in all), {report.jobs_run} "
          f"jobs run here, {report.jobs_left} left, {report.seconds:.1f} s.")
    return 0


def _online_target(args: argparse.Namespace) -> tuple[str, str]:
    """The URL and token for --url: given, or found in the data folder (`--url plugin`: the
    SillyTavern server plugin's sidecar, from its connection file; otherwise the token file)."""
    from .settings import ensure_token

    token = args.token or os.environ.get("CHRONICLER_TOKEN", "")
    settings = load_settings({"data_dir": args.data_dir})
    found = plugin_sidecar(settings.data_path)
    if args.url == "plugin":
        if found is None:
            raise SettingsError(f"--url plugin: no {CONNECTION_FILE} in {settings.data_path} (is "
                                "SillyTavern with the Chronicler plugin running?)")
        return found["url"], token or found["token"]
    if not token and found is not None and found["url"].rstrip("/") == args.url.rstrip("/").removesuffix("/v1"):
        token = found["token"]
    if not token and (settings.data_path / "token").is_file():
        token = ensure_token(settings)[0]
    return args.url, token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chronicler", description="Long-campaign memory for SillyTavern.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the sidecar's HTTP API")
    p_serve.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    p_serve.add_argument("--port", type=int, help="port (default 7711)")
    p_serve.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_serve.add_argument("--per-user", action="store_true", help="one store per SillyTavern user, named "
                         "by the server plugin on each request (the plugin starts the sidecar so)")
    p_serve.add_argument("--exit-with-stdin", action="store_true", help="stop when stdin closes (the "
                         "process that started this sidecar died)")
    p_serve.set_defaults(func=serve)

    p_install = sub.add_parser("install-extension", help="install the SillyTavern extension and point it at this sidecar")
    p_install.add_argument("--sillytavern", metavar="ST_DIR", help="SillyTavern's install folder (its data root "
                           "is read from config.yaml, default ST_DIR/data)")
    p_install.add_argument("--data-root", metavar="DATA_DIR", help="SillyTavern's data root (the folder holding "
                           "default-user/), when it is not the one ST_DIR's config.yaml names (--dataRoot)")
    p_install.add_argument("--user", default="default-user", help="SillyTavern user handle (default: default-user)")
    p_install.add_argument("--link", action="store_true", help="symlink instead of copying (for development)")
    p_install.add_argument("--data-dir", help="this sidecar's data folder (where its token and config.toml live)")
    p_install.add_argument("--no-plugin", action="store_true", help="no server plugin: the extension calls "
                           "the sidecar directly (you start it with `chronicler serve`)")
    p_install.add_argument("--st-config", help="SillyTavern's config.yaml when it is not in ST_DIR (--configPath)")
    p_install.add_argument("--allow-node-modules", action="store_true", help="install into a SillyTavern "
                           "inside node_modules even though an npm upgrade would remove the plugin")
    p_install.add_argument("--source", help=argparse.SUPPRESS)  # another extension/ folder (tests)
    p_install.set_defaults(func=install_extension)

    p_backup = sub.add_parser("backup", help="copy the store to a file (safe while serving)")
    p_backup.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_backup.add_argument("--out", help="backup file (default: DATA_DIR/backups/chronicler-<time>.sqlite3)")
    p_backup.add_argument("--user", help="the SillyTavern user whose store to copy (the server plugin's "
                          "sidecar keeps one per user; default: default-user)")
    p_backup.set_defaults(func=backup)
    p_export = sub.add_parser("export", help="write the whole store as one JSON document (sidecar stopped)")
    p_export.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_export.add_argument("--out", required=True, help="file to write (mode 0600)")
    p_export.add_argument("--no-vectors", action="store_true",
                          help="leave the vectors out (a fraction of the size); an import embeds them again")
    p_export.set_defaults(func=export_cmd)
    p_import = sub.add_parser("import", help="load an export into the store (sidecar stopped)")
    p_import.add_argument("file", help="a file written by `chronicler export` or GET /v1/export")
    p_import.add_argument("--data-dir", help="data folder (default: the user data folder)")
    p_import.add_argument("--replace", action="store_true", help="delete everything in the store first")
    p_import.add_argument("--yes", action="store_true", help="confirm --replace")
    p_import.set_defaults(func=import_cmd)
    p_chat = sub.add_parser("import-chat", help="backfill a SillyTavern chat file (.jsonl), resumable")
    p_chat.add_argument("file", help="the chat file (SillyTavern's data/<user>/chats/... .jsonl)")
    p_chat.add_argument("--chat-id", required=True, help="SillyTavern's chat id (the file name without .jsonl)")
    p_chat.add_argument("--character-id", action="append", metavar="[NAME=]ID",
                        help="the avatar file name of the chat's character, or NAME=ID per speaker (repeatable)")
    p_chat.add_argument("--user-id", help="register the persona as a player character with this id")
    p_chat.add_argument("--data-dir", help="offline: the data folder (the sidecar must be stopped)")
    p_chat.add_argument("--url", help="online: a running sidecar, e.g. http://127.0.0.1:7711, or "
                        "'plugin' for the one SillyTavern's Chronicler plugin started")
    p_chat.add_argument("--token", help="its bearer token (default: CHRONICLER_TOKEN, then the data "
                        "folder's sidecar.json or token file)")
    p_chat.add_argument("--user", help="online, the plugin's sidecar: the SillyTavern user whose store "
                        "it goes to (default: default-user)")
    p_chat.add_argument("--batch-size", type=int, default=100, help="messages per request/transaction")
    p_chat.add_argument("--wait", type=float, default=600.0, help="online: seconds to wait for its jobs")
    p_chat.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_chat.set_defaults(func=import_chat)
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
