"""Tune's experiment folder on storage as immutable generations and a manifest written last: Tune
rewrites its state files in place, on several threads, at every save, so a kill mid-upload left
them torn or mixed (``basic-variant-state-*`` unreadable after kill -9). Each top-level file is a
new object ``tune/.state/g<N>/<name>``, the manifest ``tune/.state/manifest-<N>.json`` commits an
upload, and readers see the newest one whose objects all check (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickletools
import posixpath
import re
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from sweeps.store.signing import SPOOL_BYTES, ForwardingHandler, SpooledWriter
from sweeps.store.storage import Location

STATE_DIR = ".state"
KEEP = 3
"""Manifests kept (the newest); older ones and objects no kept manifest names are deleted."""
_MANIFEST = re.compile(r"manifest-(\d{8})\.json$")
_GEN = re.compile(r"g(\d{8})$")


def _is_state(name: str) -> bool:
    """A file Tune keeps at the top of its experiment folder (hidden ones, such as Ray's
    storage marker, are written in place)."""
    return bool(name) and "/" not in name and not name.startswith(".")


def _whole_json(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except ValueError:
        return False


def _whole_pickle(data: bytes) -> bool:
    try:
        last = -1
        for op, _, pos in pickletools.genops(data):
            last = pos if op.name == "STOP" else last
        return last == len(data) - 1
    except Exception:  # noqa: BLE001 - any decoding error: not a whole pickle
        return False


def sound(name: str, data: bytes) -> bool:
    """Whether a state file decodes as a whole: Tune's experiment state as JSON, its other
    ``.json`` / ``.pkl`` files (pickles, most of them) as JSON or as a pickle stream whose STOP
    is its last byte. Nothing is unpickled; other files are taken as they are."""
    if name.startswith("experiment_state-"):
        return _whole_json(data)
    if name.endswith((".json", ".pkl")):
        return _whole_pickle(data) or _whole_json(data)
    return True


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except (FileNotFoundError, OSError):
        return None


def _good(fs: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> bool:
    """Every object the manifest names is there, of its size and digest, and decodes."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return False
    for name, e in files.items():
        if not (isinstance(e, dict) and _is_state(name) and isinstance(e.get("gen"), int)):
            return False
        data = _read(fs, _object(root, e["gen"], name))
        if data is None or len(data) != e.get("size") \
                or hashlib.sha256(data).hexdigest() != e.get("sha256") or not sound(name, data):
            return False
    return True


def _object(root: str, gen: int, name: str) -> str:
    return f"{root}/{STATE_DIR}/g{gen:08d}/{name}"


def _manifest(root: str, gen: int) -> str:
    return f"{root}/{STATE_DIR}/manifest-{gen:08d}.json"


def _listing(fs: pafs.FileSystem, root: str) -> tuple[list[int], list[int]]:
    """(manifest generations, object-folder generations) under ``root/.state``, ascending."""
    sel = pafs.FileSelector(f"{root}/{STATE_DIR}", allow_not_found=True)
    mans, gens = [], []
    for i in fs.get_file_info(sel):
        base = i.path.rsplit("/", 1)[-1]
        if m := _MANIFEST.match(base):
            mans.append(int(m.group(1)))
        elif m := _GEN.match(base):
            gens.append(int(m.group(1)))
    return sorted(mans), sorted(gens)


def newest_good(fs: pafs.FileSystem, root: str) -> tuple[dict[str, Any] | None, int]:
    """The newest manifest under ``root`` whose objects all check (see the module docstring),
    and how many newer ones failed; (None, n) when there is none."""
    skipped = 0
    for gen in reversed(_listing(fs, root)[0]):
        data = _read(fs, _manifest(root, gen))
        try:
            m = json.loads(data) if data is not None else None
        except ValueError:
            m = None
        if isinstance(m, dict) and m.get("generation") == gen and _good(fs, root, m):
            return m, skipped
        skipped += 1
    return None, skipped


class _GenWriter(SpooledWriter):
    """A write-only file: the bytes are spooled, then written whole as a new object of the
    open generation at close (see :meth:`StateHandler._landed`)."""

    def __init__(self, handler: StateHandler, name: str):
        super().__init__(SPOOL_BYTES)
        self.handler, self.name = handler, name

    def _landed(self) -> None:
        self.handler._landed(self.name, self.buf.read())


class StateHandler(ForwardingHandler):
    """``inner`` with the top-level files of the experiment folder ``root`` kept as
    generations and manifests (module docstring); every other path passes through. Pickles as
    ``(inner, root)`` (a trial's copy never writes the folder's top level)."""

    TYPE_PREFIX = "upcycle-state"

    def __init__(self, inner: pafs.FileSystem, root: str):
        self.inner, self.root = inner, root.rstrip("/")
        self._lock = threading.RLock()
        self._base: dict[str, Any] | None = None  # the committed manifest
        self._pending: dict[str, dict[str, Any] | None] = {}  # None: deleted
        self._gen: int | None = None  # the open generation
        self._next = 1
        self._open = 0
        self._txn = False
        self._skipped = 0

    def __reduce__(self):
        return StateHandler, (self.inner, self.root)

    # ---- the state ------------------------------------------------------------------------

    def _name(self, path: str) -> str | None:
        path = path.rstrip("/")
        head, name = posixpath.split(path)
        return name if head == self.root and _is_state(name) else None

    def _load(self) -> dict[str, Any]:
        with self._lock:
            if self._base is None:
                base, self._skipped = newest_good(self.inner, self.root)
                self._base = base or {"generation": 0, "files": {}}
                mans, gens = _listing(self.inner, self.root)
                self._next = max([0, *mans, *gens]) + 1  # never reuse a generation's name
            return self._base

    def view(self) -> dict[str, dict[str, Any]]:
        """Name → object entry of every state file this handler reads: the committed manifest
        with this process's pending writes over it."""
        with self._lock:
            files = {**self._load()["files"], **self._pending}
            return {k: v for k, v in files.items() if v is not None}

    @property
    def skipped(self) -> int:
        """Manifests newer than the committed one that failed their checks when read."""
        self._load()
        return self._skipped

    @property
    def generation(self) -> int:
        """The committed manifest's generation (0: none)."""
        return self._load()["generation"]

    def _open_gen(self) -> int:
        if self._gen is None:
            self._gen, self._next = self._next, self._next + 1
        return self._gen

    def _landed(self, name: str, data: bytes) -> None:
        """A writer closed: its bytes become a new object of the open generation."""
        with self._lock:
            self._open -= 1
            self._load()
            if name in self._pending and not self._txn:  # written twice: a new generation
                self.commit()
            path = _object(self.root, self._open_gen(), name)
            self.inner.create_dir(posixpath.dirname(path), recursive=True)
            with self.inner.open_output_stream(path) as f:
                f.write(data)
            self._pending[name] = {"gen": self._gen, "size": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()}

    def commit(self) -> bool:
        """Write the manifest of the open generation (its objects all written); False when
        there is nothing to commit or a write is still open."""
        with self._lock:
            if not self._pending or self._open or self._gen is None:
                return False
            files = {**self._load()["files"], **self._pending}
            man = {"generation": self._gen,
                   "files": {k: v for k, v in sorted(files.items()) if v is not None}}
            with self.inner.open_output_stream(_manifest(self.root, self._gen)) as f:
                f.write(json.dumps(man, indent=1).encode())
            self._base, self._pending, self._gen = man, {}, None
            self._collect()
            return True

    def _collect(self) -> None:
        """Delete manifests older than the newest :data:`KEEP` (first), then the objects
        of generations that no kept manifest names."""
        mans, gens = _listing(self.inner, self.root)
        kept, used = mans[-KEEP:], {e["gen"] for e in self._base["files"].values()}
        for g in kept:
            data = _read(self.inner, _manifest(self.root, g))
            with contextlib.suppress(ValueError, AttributeError, KeyError, TypeError):
                used |= {e["gen"] for e in json.loads(data or b"{}").get("files", {}).values()}
        with contextlib.suppress(FileNotFoundError, OSError):
            for g in mans[:-KEEP]:
                self.inner.delete_file(_manifest(self.root, g))
            for g in gens:
                if g not in used and g < self._base["generation"]:
                    self.inner.delete_dir(f"{self.root}/{STATE_DIR}/g{g:08d}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One upload: what was pending before is committed first (before the first upload,
        ``tuner.pkl`` joins it instead: no manifest names it without an experiment state); the
        upload's files are committed as one generation when it ends, dropped (never committed)
        if it fails."""
        with self._lock:
            if self._load()["generation"]:
                self.commit()
            self._txn = True
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._lock:
                self._txn = False
                if ok:
                    self.commit()
                else:
                    self._pending, self._gen = {}, None

    # ---- pyarrow's FileSystemHandler --------------------------------------------------------

    def _info(self, path: str, name: str) -> pafs.FileInfo:
        return pafs.FileInfo(path.rstrip("/"), pafs.FileType.File, size=self.view()[name]["size"])

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        view = self.view()
        return [self._info(p, self._name(p)) if self._name(p) in view
                else self.inner.get_file_info(p) for p in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        infos = self.inner.get_file_info(selector)
        base = selector.base_dir.rstrip("/")
        if base == self.root or (selector.recursive and self.root.startswith(base + "/")):
            view = self.view()
            infos = [i for i in infos if self._name(i.path) not in view]
            infos += [self._info(f"{self.root}/{n}", n) for n in sorted(view)]
        return infos

    def create_dir(self, path: str, recursive: bool) -> None:
        if path.rstrip("/") == self.root and not self._txn and self.generation:
            self.commit()  # an upload starts (without the wrapper; see transaction)
        self.inner.create_dir(path, recursive=recursive)

    def delete_file(self, path: str) -> None:
        name = self._name(path)
        if name and name in self.view():
            with self._lock:
                self._open_gen()
                self._pending[name] = None
            return
        self.inner.delete_file(path)

    def copy_file(self, src: str, dest: str) -> None:
        data = self._read_state(src)
        if data is None and self._name(dest) is None:
            self.inner.copy_file(src, dest)
            return
        with self.open_output_stream(dest, None) as f:
            f.write(data if data is not None else _read(self.inner, src))

    def _read_state(self, path: str) -> bytes | None:
        name = self._name(path)
        entry = self.view().get(name) if name else None
        if entry is None:
            return None
        data = _read(self.inner, _object(self.root, entry["gen"], name))
        if data is None or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise OSError(f"{path}: its object {_object(self.root, entry['gen'], name)} is "
                          "missing or does not match its manifest")
        return data

    def open_input_stream(self, path: str) -> pa.NativeFile:
        data = self._read_state(path)
        return pa.BufferReader(data) if data is not None else self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        data = self._read_state(path)
        return pa.BufferReader(data) if data is not None else self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        name = self._name(path)
        if name is None:
            return self.inner.open_output_stream(path, metadata=metadata)
        with self._lock:
            self._open += 1
        return pa.PythonFile(_GenWriter(self, name), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        if self._name(path) is not None:
            raise OSError(f"{path}: Tune's state files are written whole, never appended to")
        return self.inner.open_append_stream(path, metadata=metadata)


def state_filesystem(inner: pafs.FileSystem, root: str) -> pafs.PyFileSystem:
    """``inner`` (local, or the signing view of object storage) with the experiment folder
    ``root`` kept as generations and manifests."""
    return pafs.PyFileSystem(StateHandler(inner, root))


def handler_of(fs: Any) -> StateHandler | None:
    h = getattr(fs, "handler", None)
    return h if isinstance(h, StateHandler) else None


@contextlib.contextmanager
def committed_uploads() -> Iterator[None]:
    """While open, each upload Ray's syncer makes into a :class:`StateHandler`'s folder is one
    transaction (committed when it ends). Wraps ``ray.train._internal.storage._upload_to_fs_path``,
    which the syncer looks up at each upload (checked by tests/sweeps/test_generations.py)."""
    from ray.train._internal import storage as ray_storage

    orig = ray_storage._upload_to_fs_path
    seen: list[StateHandler] = []

    def upload(local_path: str, fs: Any, fs_path: str, exclude: Any = None) -> None:
        h = handler_of(fs)
        if h is None or fs_path.rstrip("/") != h.root:
            return orig(local_path=local_path, fs=fs, fs_path=fs_path, exclude=exclude)
        if h not in seen:
            seen.append(h)
        with h.transaction():
            orig(local_path=local_path, fs=fs, fs_path=fs_path, exclude=exclude)

    ray_storage._upload_to_fs_path = upload
    try:
        yield
    finally:
        ray_storage._upload_to_fs_path = orig
        for h in seen:  # whatever was written after the last upload (tuner.pkl)
            h.commit()


def tune_storage(results_dir: Any) -> tuple[pafs.PyFileSystem, str, str]:
    """Tune's storage for a results folder (a local ``Path``, or a ``Location`` on object
    storage, seen through the signing filesystem): (filesystem, storage path, experiment
    folder ``<results>/tune``), the folder kept as generations and manifests."""
    if isinstance(results_dir, Location):
        inner, base = results_dir.signed().fs, results_dir.path
    else:
        inner, base = pafs.LocalFileSystem(), str(results_dir)
    return state_filesystem(inner, f"{base}/tune"), base, f"{base}/tune"
