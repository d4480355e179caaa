"""Reading the small files a user names (configs, kernels, plans) without trusting them to be small
or to be files: a FIFO without a writer would block forever, ``/dev/zero`` never ends, a 20 GB
file would be read whole. :func:`read_bounded` refuses anything but a regular file and anything
over its limit, naming both; :func:`load_toml` adds TOML's own failure modes (not UTF-8, bad
syntax, nesting deep enough to exhaust Python's recursion) as one :class:`InputFileError`.
"""
from __future__ import annotations

import os
import stat
import sys
from typing import Any, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["InputFileError", "read_bounded", "load_toml", "KIB", "MIB"]

KIB, MIB = 1 << 10, 1 << 20


class InputFileError(ValueError):
    """A named input file that cannot be read as asked: one line saying which file and why."""


def read_bounded(path: Union[str, os.PathLike], limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; InputFileError for a
    missing path, a directory, a FIFO, a device or socket, or a file over the limit. Opened
    non-blocking, so a FIFO is refused at once instead of waiting for a writer."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputFileError(f"{what} {name} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"{what} {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
            raise InputFileError(f"{what} {name} is {kind}; name a regular file")
        if st.st_size > limit:
            raise InputFileError(f"{what} {name} is {st.st_size:,} bytes, over the {limit:,}-byte limit")
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as exc:
                raise InputFileError(f"{what} {name}: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # grew while read (or a file whose size lies: /proc)
                raise InputFileError(f"{what} {name} is over the {limit:,}-byte limit")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_toml(path: Union[str, os.PathLike], limit: int = MIB, what: str = "config") -> dict[str, Any]:
    """A TOML file as a dict, read with :func:`read_bounded`; every way it can be unreadable is one
    InputFileError naming the file."""
    data = read_bounded(path, limit, what)
    name = os.fspath(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{what} {name} is not UTF-8 text (byte {exc.start}), so not TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputFileError(f"{what} {name} is not readable TOML: {exc}") from None
    except RecursionError:
        raise InputFileError(f"{what} {name}: TOML nested too deeply to read") from None
