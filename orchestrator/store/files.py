"""Writing and reading the files of a sweep directory so that no reader sees half of one.

Files that several processes may write (units.json, env.json, markers, the results document)
are written to a temp file and ``os.replace``d into place; the temp file's name carries host and
pid, so one left by a killed writer can be cleaned up (``remove_dead_temps``). ``SweepDir``
(``sweepdir``) says which files a sweep directory holds.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import os
import re
import socket
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from orchestrator.errors import SweepDirError
from orchestrator.store.filekinds import odd_kind, refusal
from orchestrator.store.pidspace import pid_alive


def link_target(path: Path) -> Path:
    """The file a write to ``path`` lands in: a link's target (the link stays), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


NAME_MAX = 255  # bytes in one file name, on the filesystems a cluster uses (ext4, xfs, NFS, Lustre)


def temp_path(path: Path) -> Path:
    """A temp file beside ``path`` whose name says which process writes it, so one left by a
    killed writer can be told apart from one still being written (``remove_dead_temps``)."""
    return path.with_name(f".{temp_stem(path.name)}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def temp_stem(name: str) -> str:
    """``name`` as its temp files spell it (``fitted`` to what they add to it)."""
    return fitted(name, len(os.fsencode(f"..{socket.gethostname()}.{2**32}.12345678.tmp")))


def beside(path: Path, prefix: str, suffix: str) -> Path:
    """The file named ``prefix + path's name + suffix`` beside ``path`` (its lock, its key index),
    the name ``fitted`` to what the two add."""
    return path.with_name(prefix + fitted(path.name, len(os.fsencode(prefix + suffix))) + suffix)


def fitted(name: str, added: int) -> str:
    """``name`` as a file named after it spells it where that adds ``added`` bytes to it (a
    lock, a key index, a temp file): whole where the sum stays within ``NAME_MAX``, else its
    start and a hash of the whole, so every name a filesystem takes has its files too."""
    raw = os.fsencode(name)
    if len(raw) + added <= NAME_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return os.fsdecode(raw[: NAME_MAX - added - 13]) + "~" + digest


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", *, fsync: bool = True) -> Iterator[IO[Any]]:
    """Write a file through a temp file beside it that replaces it only once complete, so a
    reader sees the old file or the new one, never a half-written one. The new file keeps the
    permission bits of the one it replaces (a document made group-readable stays so)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with naming(path), open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            _keep_mode(path, f.fileno())
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:  # make the rename itself durable
        try:
            dfd = os.open(path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError of the block that names no file names ``path``: what ``write()``, ``flush()``,
    ``close()`` or ``fsync()`` of an open file raises (a full disk) says only its errno, and the
    line ``main`` makes of it (``cannot_write``) must say which file."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = os.fspath(path)
        raise


def _keep_mode(path: Path, fd: int) -> None:
    """Give the temp file open as ``fd`` the permission bits of ``path``, where it exists."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    os.fchmod(fd, mode)


def remove_dead_temps(path: Path, min_age_s: float = 600.0) -> list[Path]:
    """Delete temp files (``temp_path``) of ``path``, or of any file in the folder ``path``,
    left by writers on this host that are dead (killed mid-write) and idle for ``min_age_s``:
    incomplete copies, never data. Live writers' temps are kept."""
    folder, target = (path, r".+") if path.is_dir() else (path.parent, re.escape(temp_stem(path.name)))
    pattern = re.compile(rf"\.{target}\.{re.escape(socket.gethostname())}\.(\d+)\.[0-9a-f]{{8}}\.tmp")
    removed: list[Path] = []
    try:
        candidates = list(folder.glob(".*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        m = pattern.fullmatch(tmp.name)
        if m is None:
            continue
        try:
            if time.time() - tmp.stat().st_mtime < min_age_s or pid_alive(int(m.group(1)), None):
                continue
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            continue
    return removed


def open_file(path: Path) -> IO[bytes]:
    """``path``, a file of a sweep directory, open for reading; ``SweepDirError`` where it is a
    pipe, a device or a socket (or a link to one), whose reading would never end or never
    come, and ``IsADirectoryError`` where it is a folder (``misplaced`` words that)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe's open would wait for a writer
    return os.fdopen(_plain(fd, path), "rb")


def open_append(path: str | os.PathLike[str], mode: str = "a") -> IO[Any]:
    """``path``, a file of a sweep directory (a history, a log), open to append to in ``mode``
    ("a" or "ab"), made where missing (``append_fd``)."""
    return os.fdopen(append_fd(path), mode, encoding=None if "b" in mode else "utf-8")


def append_fd(path: str | os.PathLike[str]) -> int:
    """A descriptor appending to ``path``, made where missing; ``SweepDirError`` where it is a
    pipe, a device or a socket (or a link to one), whose write would wait for a reader for ever
    or go nowhere, as ``open_file`` says."""
    try:  # a pipe's open would wait for a reader: without one, O_NONBLOCK makes it fail (ENXIO)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a pipe no process reads, or a socket
            raise refusal(Path(path), odd_kind(os.stat(path).st_mode) or "no file") from None
        raise
    return _plain(fd, Path(path))


def _plain(fd: int, path: Path) -> int:
    """``fd``, open on ``path`` without waiting, made blocking once ``fstat`` says it is a
    regular file; closed, and the error ``open_file`` names raised, where it is not one."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        what = odd_kind(mode)
        if what is not None:
            raise refusal(path, what)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_file(path: Path) -> bytes:
    """The bytes of ``path``, a file of a sweep directory (``open_file``)."""
    with open_file(path) as f:
        return f.read()


def read_text(path: Path) -> str:
    """The text of ``path``, a file of a sweep directory (``open_file``), as UTF-8."""
    return read_file(path).decode("utf-8")


def create_once(path: Path, payload: bytes) -> bool:
    """Make ``path`` holding ``payload`` where no file is there yet; False where another writer
    made it first (a lock file, ``env.json``). The payload goes to a temp file that is linked
    into place only once complete (atomic, fails if the name exists, works on NFS), so a reader
    never sees it half written and a write that fails (a full disk) leaves no file. Where links
    are not, the file is created exclusively, then written."""
    tmp = temp_path(path)
    try:
        write_new(tmp, payload)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here: create-exclusive, then write
            try:
                write_new(path, payload)
            except FileExistsError:
                return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_new(path: Path, payload: bytes) -> None:
    """Create ``path`` with ``payload``, durably; never through a link planted at its name
    (O_EXCL fails on any existing name, a symbolic link's included)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with naming(path), os.fdopen(fd, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


# the errors only a write raises that the user, not the code, must fix: space, quota, a read-only mount
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
# the errors of a file or folder that this user may not read (or write): its permissions
ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
# what to do about a damaged file of a sweep directory
DAMAGED_FIX = (
    "the sweep directory is damaged: restore the file from a copy, or run the spec in a new --sweep-dir with "
    "--reuse of this sweep's results document (what it merged is not measured again)"
)
_TEMP = re.compile(r"\.(?P<name>.+)\.[^.]+\.\d+\.[0-9a-f]{8}\.tmp")


def write_advice(exc: OSError) -> str:
    """What to do about ``exc``, raised writing a file: the fix its errno calls for, naming the
    filesystem the file is on (what ``df`` names) where the fix is that filesystem's."""
    at = "" if exc.filename is None else f"the filesystem at {mount_point(Path(os.fsdecode(exc.filename)))}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on its disk{f', {at}' if at else ''} (or raise the quota)"
    if exc.errno == errno.EROFS:
        return f"{at or 'its filesystem'} is mounted read-only"
    return "make it and its folder writable (chmod, or chattr -i where it is immutable)"


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem ``path`` is on (what ``df`` names)."""
    path = path.absolute()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def cannot_write(exc: OSError) -> str:
    """One line for ``exc`` (errno in ``WRITE_ERRNOS``): the file it failed to write, under its
    own name where it was the temp file of one (``temp_path``), and the fix."""
    name = _own_name(exc.filename)
    what = name if name is not None else "a file"
    return f"cannot write {what} ({exc.strerror or exc}): {write_advice(exc)}"


def _own_name(filename: Any) -> str | None:
    """``filename`` of an OSError as a path, under its own name where it is the temp file of
    one (``temp_path``)."""
    if filename is None:
        return None
    path = Path(os.fsdecode(filename))
    m = _TEMP.fullmatch(path.name)
    return str(path.with_name(m["name"]) if m else path)


def cannot_access(exc: OSError) -> str:
    """One line for ``exc`` (errno in ``ACCESS_ERRNOS``, naming a file): the file or folder
    this user may not read and how to let them, or, where it is readable (or not there: it
    was to be made), the one it may not write (``cannot_write``)."""
    name = _own_name(exc.filename)
    if name is None:
        return f"{exc.strerror or exc}: run as the user who owns the sweep directory"
    try:
        st = os.stat(name)
    except FileNotFoundError:
        return cannot_write(exc)
    except OSError:  # a folder above it may not be searched
        fix = "make the folders above it searchable for you (`chmod +x` as their owner), or run as their owner"
    else:
        folder = stat.S_ISDIR(st.st_mode)
        mode = os.R_OK | (os.X_OK if folder else 0)
        if os.access(name, mode, effective_ids=os.access in os.supports_effective_ids):
            return cannot_write(exc)
        fix = f"make it readable for you (`chmod {'+rx' if folder else '+r'} {name}` as its owner), or run as its owner"
    return f"cannot read {name} ({exc.strerror or exc}): {fix}"


def name_too_long(exc: OSError) -> str:
    """One line for ENAMETOOLONG: the path whose name (or whole) is longer than a filesystem
    takes, and the fix."""
    name = "a path" if exc.filename is None else _own_name(exc.filename)
    return (
        f"cannot use {name}: a name in it is longer than its filesystem takes ({NAME_MAX} bytes a name, "
        f"{os.pathconf('/', 'PC_PATH_MAX')} a path); choose a shorter one"
    )


def misplaced(exc: OSError) -> str | None:
    """One line for a file where a folder belongs, or a folder where a file does (``exc``:
    ENOTDIR, EISDIR, naming the path; a damaged sweep directory, a file made by hand), naming
    which and the fix; None for any other error."""
    if exc.filename is None or exc.errno not in (errno.ENOTDIR, errno.EISDIR):
        return None
    path = Path(os.fsdecode(exc.filename))
    if exc.errno == errno.EISDIR:
        return f"{path} is a directory, where a file belongs: move it away (or put the file back) and run again"
    on_the_way = next((p for p in [*reversed(path.parents), path] if p.is_file()), path)
    return f"{on_the_way} is a file, where a directory belongs: move it away (or put the directory back) and run again"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory, fsync, then rename into place."""
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_json(path: Path, obj: Any, indent: int | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_file(path).decode("utf-8"))
    except FileNotFoundError:
        raise SweepDirError(f"{what} {path} is missing; {DAMAGED_FIX}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        if isinstance(exc, OSError) and exc.errno in ACCESS_ERRNOS:  # not damaged: this user may not read it
            raise SweepDirError(cannot_access(exc)) from None
        raise SweepDirError(f"{what} {path} is unreadable ({exc}); {DAMAGED_FIX}") from None


def folder_refuses(out: Path) -> tuple[Path, str | None] | None:
    """Where no file could be made at ``out``: its nearest existing folder, and why (``None``
    where that is no directory); ``None`` where one could. Checked before the work that ends
    in writing it, not after."""
    folder = out.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return folder, None
    if not os.access(folder, os.W_OK | os.X_OK):
        return folder, "read-only or not yours"
    try:  # root passes access() where no file can be made (/proc, a read-only mount, chattr +i): try one
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:  # ENOENT from a folder that exists: a filesystem that holds no files (/proc)
        return folder, "not a filesystem that holds files" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
    return None


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links too; by path where one does not exist)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return a.resolve() == b.resolve()
