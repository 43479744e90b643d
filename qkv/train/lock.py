"""An OS-level lock on a run directory, so that one training at a time writes into it.

:class:`RunLock` holds an advisory lock (``fcntl.flock``; ``msvcrt.locking`` on Windows) on ``RUN/.qkv-lock`` for
the life of a run. The operating system releases it when the process ends, however it ends, so a lock left by a
killed process is never mistaken for a live one. A second training of the same directory is refused at once with a
:class:`RunInUseError` naming the process that holds it (pid, host, start time and command, read from the file).

The lock file is removed on release while still locked; an acquirer that locked a file which was meanwhile
removed sees that its file is no longer the one at the path (a different inode) and tries again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from ..options import NamesOptions, option_error, ref

__all__ = ["RunLock", "RunInUseError", "LOCK_NAME", "holder_description"]

log = logging.getLogger(__name__)

LOCK_NAME = ".qkv-lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None

_MSVCRT_OFFSET = 1 << 30  # lock a byte far past the contents, so that others can still read who holds it


class RunInUseError(NamesOptions, FileExistsError):
    """Another live process holds the run directory's lock (the message names the option that chose the directory
    as :class:`qkv.options.OptionError` does: ``template``, the options, the values)."""


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` without waiting; ``False`` if another process holds it."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            return False
        return True
    if msvcrt is not None:  # pragma: no cover - Windows
        os.lseek(fd, _MSVCRT_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    return True  # pragma: no cover - no locking at all: RunLock warns once


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        elif msvcrt is not None:  # pragma: no cover - Windows
            os.lseek(fd, _MSVCRT_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)


def holder_description(info: dict) -> str:
    """``pid 123 on host, since 2024-01-02 03:04:05: qkv train ...`` from the lock file's contents."""
    if not isinstance(info, dict) or "pid" not in info:
        return "a process that is starting"
    text = f"pid {info['pid']}"
    if info.get("host") and info["host"] != socket.gethostname():
        text += f" on {info['host']}"
    if isinstance(info.get("started"), (int, float)):
        text += f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info['started']))}"
    if info.get("command"):
        command = " ".join(str(info["command"]).split())
        text += f": {command[:120]}{'...' if len(command) > 120 else ''}"
    return text


def _read_info(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        return json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}


def _command() -> str:
    """This process's command line, its program without the folder (``python -m qkv.cli ...``, ``qkv ...``)."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv or ["python"])
    if len(argv) > 2 and argv[1] == "-m" and Path(argv[0]).name.startswith("python"):
        argv[0] = "python"
    return " ".join([Path(argv[0]).name, *argv[1:]])


class RunLock:
    """Hold ``directory``'s run lock: ``with RunLock(out, flag="out"): ...`` (or :meth:`acquire`/:meth:`release`).

    ``acquire`` creates the directory if needed; ``release`` removes the lock file, and the directory too when this
    lock created it and nothing else was written there. ``flag`` (the option that named the directory, by its field
    name) appears in the error messages, which the command line writes with its own flag.

    Raises (from ``acquire``):
        RunInUseError: another live process holds the lock (the message names it).
        OSError: the directory cannot be created or written (the message names it and ``flag``).
    """

    _warned = False

    def __init__(self, directory: str | os.PathLike, *, flag: str = "out"):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self.flag = flag
        self._fd: int | None = None
        self._created = False

    def _error(self, e: OSError, doing: str) -> OSError:
        err = option_error(OSError, "cannot {doing} {directory} (" + ref(self.flag) + "): {why}", self.flag,
                           doing=doing, directory=self.directory, why=e.strerror or e)
        err.errno = e.errno
        return err

    def acquire(self) -> RunLock:
        if fcntl is None and msvcrt is None and not RunLock._warned:  # pragma: no cover - exotic platforms
            RunLock._warned = True
            log.warning("this platform has no file locking: two trainings in one run directory are not prevented")
        for _ in range(20):
            if self.directory.exists() and not self.directory.is_dir():
                raise option_error(NotADirectoryError, "{directory} (" + ref(self.flag) + ") is a file, not a run "
                                   "directory", self.flag, directory=self.directory)
            if not self.directory.exists():
                try:
                    self.directory.mkdir(parents=True)
                    self._created = True
                except FileExistsError:
                    pass
                except OSError as e:
                    raise self._error(e, "create the run directory") from None
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory was removed meanwhile: again
                continue
            except OSError as e:
                raise self._error(e, "write into the run directory") from None
            if not _try_lock(fd):
                info = _read_info(fd)
                os.close(fd)
                raise RunInUseError("{directory} (" + ref(self.flag) + ") is in use by another training ({holder}); "
                                    "wait for it to end, or choose another " + ref(self.flag), self.flag,
                                    directory=self.directory, holder=holder_description(info))
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:  # we locked a file that its holder removed on release: again, with the new one
                _unlock(fd)
                os.close(fd)
                continue
            info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": _command()}
            try:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
            except OSError as e:
                self._fd = fd
                self.release()
                raise self._error(e, "write into the run directory") from None
            self._fd = fd
            return self
        raise option_error(OSError, "cannot lock {directory} (" + ref(self.flag) + "): its lock file keeps "
                           "disappearing", self.flag, directory=self.directory)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if os.name != "nt":  # removed while still locked (see the module docstring)
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        _unlock(fd)
        os.close(fd)
        if os.name == "nt":  # pragma: no cover - Windows cannot remove an open file
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self._created:
            with contextlib.suppress(OSError):  # only when nothing else was written there
                self.directory.rmdir()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
