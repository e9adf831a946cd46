"""The stores one sidecar serves: one (direct mode), or one per SillyTavern user (per-user mode).

In per-user mode the SillyTavern server plugin starts the sidecar and names, on each request, the
user handle whose store it is for (`X-Chronicler-User`, honoured only with the plugin's token:
api/security checks it). Each handle gets its own folder under `DATA_DIR/users/`: its own SQLite
file, search index, job worker and settings (store_settings). What is costly and the same for all
(the embedding model, the token counter, the clock) is made once and shared. A store opens on its
user's first request.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping

from . import priority, store_settings
from .services import Services
from .settings import Settings

DEFAULT_USER = "default-user"
USERS_FOLDER = "users"
# SillyTavern's user handles are lower-case letters, digits and dashes (its `slugify` of a name).
HANDLE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class BadHandle(ValueError):
    """A user handle that cannot name a store folder."""


class Stores:
    """Every open store by handle; `open` builds one store's Services from its settings, `close`
    ends one (its worker, its database)."""

    def __init__(self, base: Settings, open_store: Callable[[Settings], Services],
                 close_store: Callable[[Services], None], *, per_user: bool) -> None:
        self.base = base
        self.per_user = per_user
        self._open = open_store
        self._close = close_store
        self._lock = priority.Lock()
        self._stores: dict[str, Services] = {}
        self._changes: dict[str, dict[str, Any]] = {}

    def folder(self, handle: str) -> Path:
        """The store's folder: the data folder itself in direct mode, users/<handle> per user."""
        if not self.per_user:
            return self.base.data_path
        if not HANDLE.fullmatch(handle):
            raise BadHandle(f"{handle!r} is not a SillyTavern user handle")
        return self.base.data_path / USERS_FOLDER / handle

    def get(self, handle: str | None = None) -> Services:
        """The store of `handle` (the default user's when None), opened on first use."""
        handle = handle or DEFAULT_USER
        folder = self.folder(handle)
        with self._lock:
            if handle not in self._stores:
                changes = store_settings.read(folder, self.base)
                self._stores[handle] = self._open(store_settings.layered(self.base, changes, folder))
                self._changes[handle] = changes
            return self._stores[handle]

    def handle_of(self, svc: Services) -> str:
        """The handle a store was opened for."""
        return next(h for h, s in self._stores.items() if s is svc)

    def changes(self, handle: str) -> dict[str, Any]:
        """The settings this store changed over the sidecar's."""
        self.get(handle)
        return dict(self._changes[handle])

    def change_settings(self, handle: str, changes: Mapping[str, Any]) -> Services:
        """Check, save and apply a change of one store's settings (all of it, or nothing: raises
        store_settings.FieldError before anything is written)."""
        svc = self.get(handle)
        with self._lock:
            merged = store_settings.check_changes(self.base, self._changes[handle], changes)
            folder = self.folder(handle)
            settings = store_settings.layered(self.base, merged, folder)
            store_settings.write(folder, merged)
            self._changes[handle] = merged
            svc.settings = settings  # read at use by every concept and the worker
        return svc

    def all(self) -> list[Services]:
        with self._lock:
            return list(self._stores.values())

    def close_all(self) -> None:
        """End every store (at shutdown)."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for svc in stores:
            self._close(svc)
