"""The one way out: every file or folder vocagno writes goes through here, so nothing is written, chmod-ed or deleted
through a link someone planted where vocagno writes (a shared out-root, a bucket's local cache, ``--out``).

- A file is written under a fresh name of its own (``O_CREAT | O_EXCL``, which never follows a link) and renamed
  into place (``write_atomically``): readers see the old file or the whole new one.
- A folder is built in a fresh private staging folder (``staging``: a random name inside a ``mkdtemp`` folder beside
  where it goes, both ``0700``, names no one else can have made or can list) and renamed into place (``publish``); a
  staging name vocagno did not create this run is never reused.
- A file that must land somewhere private before it is checked (a download) lands in a ``PrivateFolder``, written
  through its descriptor, so a folder swapped for a link after it was made leads nothing out.
- What stands in the way is removed by ``remove``: a link is unlinked, never followed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

__all__ = ["PrivateFolder", "append", "make_readable", "move_inside", "own_temporary", "publish", "remove",
           "save_figure", "staging", "write_atomically", "write_inside"]


def own_temporary(path: str | Path) -> Path:
    """A hidden name beside ``path`` that no other process writing ``path`` at the same time picks (pid, random)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def write_atomically(path: str | Path, content: str | bytes) -> None:
    """Write a file so that it is either its old self or complete (a full disk or a kill leaves no truncated file):
    a new file of this writer's own beside it (created exclusively: a link planted at that name is not followed),
    flushed to disk, renamed over ``path`` (a link at ``path`` is replaced, not written through)."""
    tmp = own_temporary(path)
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _folder(folder: str | Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``folder / parts...``, each part made where missing and opened without following a link (a
    link planted at any part below ``folder`` is refused: ``NotADirectoryError``). ``parts`` are plain names (the
    caller checked them: ``vocagno.doors.untrusted.inside``)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                raise NotADirectoryError(f"{Path(folder, *parts)}: {part} is not a folder of its own (a link?): "
                                         "nothing is written through it") from error
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_inside(folder: str | Path, relative: str, content: bytes | str) -> None:
    """``write_atomically`` of ``folder / relative``, its folders below ``folder`` made or entered without following
    a link: a folder others can write (a shard cache, an out-root) can't lead the write out of ``folder``."""
    *parents, name = Path(relative).parts
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd = _folder(folder, tuple(parents))
    tmp = own_temporary(name).name
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(fd)


def move_inside(source: str | Path, folder: str | Path, relative: str) -> None:
    """Rename the file ``source`` (one of this process's own, on the same file system) to ``folder / relative``, its
    folders below ``folder`` made or entered without following a link."""
    *parents, name = Path(relative).parts
    fd = _folder(folder, tuple(parents))
    try:
        os.replace(source, name, dst_dir_fd=fd)
    finally:
        os.close(fd)


def append(path: str | Path, text: str) -> None:
    """Append ``text`` to the regular file at ``path`` (created if missing, with its folder): a log's next lines.
    A link or anything but a regular file at ``path`` is refused (``OSError``), never written through."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(f"{path}: not a regular file: a log is appended to a file of its own")
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def save_figure(figure, path: str | Path, **kwargs) -> None:
    """A matplotlib figure saved as ``write_atomically`` writes (its format from ``path``'s suffix)."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    write_atomically(path, buffer.getvalue())


_OUTER: dict[Path, Path] = {}  # a staging folder -> the private folder it stands in


def staging(final: str | Path) -> Path:
    """A new empty folder of this process's own to build ``final`` in: ``.NAME.staging-XXXX/YYYY`` beside ``final``,
    both made by ``mkdtemp`` (``0700``). Writers fill it by path (``MDSWriter``, ``save_pretrained``): someone who can
    write the folder beside ``final``, and who swaps ``.NAME.staging-XXXX`` for a link while it fills, can point the
    link at no folder that holds ``YYYY`` (a random name they can't list), so no write follows it anywhere.
    ``publish`` and ``remove`` take the outer folder away with it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    outer = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.staging-"))
    built = Path(tempfile.mkdtemp(dir=outer, prefix="built-"))
    _OUTER[built] = outer
    return built


class PrivateFolder:
    """A new folder of this process's own (``mkdtemp``: hidden, ``0700``) inside ``parent``, held open: ``path`` names
    it through its descriptor (``/proc/self/fd/N``), so a writer given that path writes into this very folder even
    where someone who can write ``parent`` renames it and plants a link at its name. Refused (``PermissionError``)
    where what stands at the name once made is not a folder of this user's that only this user can enter. A
    context manager: on exit, its files are removed through the descriptor and the folder by its name."""

    def __init__(self, parent: str | Path, prefix: str):
        self.name = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
        try:
            self.fd = os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # ELOOP or ENOTDIR: a link at its name
            self.fd = None
        info = None if self.fd is None else os.fstat(self.fd)
        if info is None or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            self.close()
            raise PermissionError(f"{self.name}: the private folder it made was replaced (by someone who can write "
                                  f"{parent}): nothing is written through it")
        self.path = Path(f"/proc/self/fd/{self.fd}")

    def __enter__(self) -> PrivateFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            for entry in os.listdir(self.fd):
                try:
                    os.unlink(entry, dir_fd=self.fd)
                except IsADirectoryError:
                    shutil.rmtree(entry, dir_fd=self.fd)
            own = os.fstat(self.fd)
            os.close(self.fd)
            self.fd = None
            try:
                now = os.lstat(self.name)
            except FileNotFoundError:
                return
            if (now.st_dev, now.st_ino) == (own.st_dev, own.st_ino):  # still ours at its name
                os.rmdir(self.name)


def publish(built: str | Path, final: str | Path, replace: bool = False) -> None:
    """Rename the folder or file ``built`` (made by ``staging``) to ``final``. Where something stands at ``final``:
    refused (``FileExistsError``) unless ``replace``, then moved aside first and removed once ``built`` is in place (a
    link there is unlinked, never followed)."""
    built, final = Path(built), Path(final)
    aside = None
    if os.path.lexists(final):
        if not replace:
            raise FileExistsError(f"{final} exists")
        aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.replaced-"))
        os.rename(final, aside / "old")
    os.rename(built, final)
    if aside is not None:
        remove(aside)
    if built in _OUTER:
        remove(_OUTER.pop(built))


def remove(path: str | Path) -> None:
    """Remove what stands at ``path``: a file or a link is unlinked (a link never followed), a folder removed with what
    it holds (``shutil.rmtree`` unlinks the links inside it, never what they name)."""
    path = Path(path)
    if path.is_symlink() or path.is_file() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    if path in _OUTER:  # a staging folder: the private folder it stands in too
        remove(_OUTER.pop(path))


def make_readable(folder: str | Path, umask: int | None = None) -> None:
    """Give the files and folders under ``folder`` (built by ``staging``, private) the modes a plain write gives them
    under the umask. Walked through descriptors from ``folder`` opened without following a link (a link at its name,
    planted after it was made, is refused: ``OSError``), each file opened the same way before its mode is set, so no
    link, at any depth, leads a change of mode out."""
    if umask is None:
        umask = os.umask(0)
        os.umask(umask)
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _, _, files, where in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in files:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=where)
                except OSError:  # a link (ELOOP), or gone
                    continue
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        os.fchmod(fd, 0o666 & ~umask)
                finally:
                    os.close(fd)
            os.fchmod(where, 0o777 & ~umask)  # this folder (fwalk yields each folder's own descriptor)
    finally:
        os.close(top)
