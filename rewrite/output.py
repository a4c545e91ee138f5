"""Putting a rewritten model where the user asked, losing nothing on the way.

What this module guarantees (the README's "What `apply` guarantees" quotes
it, and tests/test_output.py checks each sentence):

- The output appears complete or not at all. It is written into a hidden
  staging folder beside the destination and moved into place with a single
  rename: `rename(2)` for a file, an atomic exchange of the two folders for
  an `.mlpackage` that already exists.
- Nothing the input consists of (the model file, its external data, every
  file of a package) is written, moved or deleted, unless the user asked for
  `--in-place`, and then only by that one rename or exchange.
- An existing destination is replaced only by the same kind of thing: a file
  by a file, an `.mlpackage` by an `.mlpackage`. A folder is never replaced
  by a file, nor a folder that is not a package by a package.
- Companion files (an ONNX model's external data) get a name that is free,
  and are linked in without replacing anything before the model is renamed
  into place, so the old model and its data stay a valid pair until that
  rename, and the new pair is valid after it.
- Whatever goes wrong, a signal included, the staging folder and any
  companion not yet referenced are removed. Only SIGKILL or a power loss
  can leave a hidden `.rewrite-staging-*` folder behind unannounced, and
  even then the destination is the old model or the new one, never neither.
- Nothing is left behind silently: a staging folder, companion or replaced
  data file that cannot be removed is named in a warning (the write itself
  still succeeds or fails as it would have).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

STAGING_PREFIX = ".rewrite-staging-"


class OutputError(Exception):
    """The output cannot be written where asked; nothing was changed."""


class ReplacedPackageStranded(OSError):
    """An exchange by two renames failed halfway and could not be undone.

    The replaced package is at `parked` (inside the staging folder), and
    nothing is at the destination: `publish` keeps the folder and says so.
    """

    def __init__(self, cause: OSError, parked: Path):
        super().__init__(cause.errno, cause.strerror or str(cause), str(parked))
        self.parked = parked


@dataclass(frozen=True)
class Target:
    """Where a model will be written.

    `path` is absolute, with symlinks in its folder resolved and a symlink at
    the destination itself followed (the link stays; what it names is
    replaced). `replaces` says whether something of the same kind is there.
    """

    path: Path
    package: bool
    replaces: bool


def resolve_target(
    requested: str | os.PathLike,
    *,
    package: bool,
    input_path: Path,
    input_files: Iterable[Path],
    in_place: bool,
) -> Target:
    """Decide where `requested` writes, or raise `OutputError` saying why not.

    `input_files` are every file the input model consists of; none of them may
    be the destination, and for packages neither tree may contain the other.
    """
    requested = Path(requested)
    if str(requested) == "" or requested.name in ("", ".", ".."):
        raise OutputError(f"'{requested}': not a file name")
    path = Path(os.path.abspath(requested))
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    parent = path.parent
    if not parent.exists():
        raise OutputError(f"{parent}: no such directory")
    if not parent.is_dir():
        raise OutputError(f"{parent}: not a directory")
    path = parent.resolve() / path.name
    source = Path(os.path.realpath(input_path))
    if path == source and not in_place:
        raise OutputError(f"{requested}: refusing to overwrite the input; use --in-place")

    replaces = os.path.lexists(path)
    if replaces:
        mode = os.lstat(path).st_mode
        if package:
            if stat.S_ISREG(mode):
                raise OutputError(f"{requested}: is a file, not an .mlpackage; refusing to replace it")
            if not stat.S_ISDIR(mode) or not (path / "Manifest.json").is_file():
                raise OutputError(
                    f"{requested}: exists and is not an .mlpackage (no Manifest.json); refusing to replace it"
                )
        elif stat.S_ISDIR(mode):
            raise OutputError(f"{requested}: is a directory; refusing to replace a folder with a file")
        elif not stat.S_ISREG(mode):
            raise OutputError(f"{requested}: exists and is not a regular file; refusing to replace it")

    if not in_place:
        for file in input_files:
            real = Path(os.path.realpath(file))
            if real == path or (replaces and not package and _same_file(real, path)):
                raise OutputError(f"{requested}: is part of the input model ({real.name}); refusing to overwrite it")
        if path in source.parents:
            raise OutputError(f"{requested}: contains the input; refusing to replace it")
        if source in path.parents:
            raise OutputError(f"{requested}: is inside the input; refusing to write there")
    return Target(path, package, replaces)


def _same_file(left: Path, right: Path) -> bool:
    try:
        return os.path.samefile(left, right)
    except OSError:
        return False


def free_companion_name(target: Target, suffix: str, avoid: Collection[Path] = ()) -> str:
    """A name for a file written beside `target` (`<name><suffix>` if nothing has it).

    A name in use, or one in `avoid` (the input's own companions), gets a
    random part, so that writing it never replaces anything.
    """
    avoid_names = {Path(p).name for p in avoid if Path(os.path.realpath(p)).parent == target.path.parent}
    preferred = target.path.name + suffix
    if preferred not in avoid_names and not os.path.lexists(target.path.parent / preferred):
        return preferred
    while True:
        name = f"{target.path.name}.{secrets.token_hex(4)}{suffix}"
        if not os.path.lexists(target.path.parent / name):
            return name


def warn_on_stderr(message: str) -> None:
    """`publish`'s default `warn`: one line on stderr, as the CLI words its notes."""
    print(f"rewrite: warning: {message}", file=sys.stderr)


def publish(
    target: Target,
    write: Callable[[Path], None],
    *,
    obsolete: Collection[Path] = (),
    warn: Callable[[str], None] = warn_on_stderr,
) -> None:
    """Write through `write(staged_path)` and move the result to `target`.

    Files `write` leaves beside the staged model (external data) are linked
    into the destination's folder first, never replacing a file; the model
    follows with one rename or exchange. After that, `obsolete` files (the
    replaced model's old external data, which nothing now references) are
    removed. Raises `OutputError` if anything fails; the destination is then
    as it was.

    Whatever of ours cannot be removed afterwards, on success or failure (the
    staging folder, a companion linked in for a model that did not go in, an
    obsolete file), is named in a call of `warn`: a leftover is never silent.
    """
    parent = target.path.parent
    staging = _make_staging(parent)
    linked: list[Path] = []
    keep_staging = False
    try:
        staged = staging / target.path.name
        try:
            write(staged)
        except (OutputError, KeyboardInterrupt, Terminated):
            raise
        except Exception as error:  # the libraries raise many kinds; all mean "could not save"
            raise OutputError(f"{target.path}: could not write the model ({_first_line(error)})") from None
        if not os.path.lexists(staged):
            raise OutputError(f"{target.path}: the model writer produced nothing")
        companions = sorted(p for p in staging.iterdir() if p.name != staged.name)
        try:
            _set_modes(staged, companions, target)
        except OSError as error:
            raise OutputError(f"{target.path}: could not set the output's modes ({_reason(error)})") from None
        _sync_tree(staging)
        with _signals_deferred():
            try:
                for companion in companions:
                    destination = parent / companion.name
                    FILESYSTEM.link_new(companion, destination)
                    linked.append(destination)
                _install(staged, target, staging)
            except ReplacedPackageStranded as error:
                # The old package is the only copy of the user's model now:
                # removing the staging folder would lose it.
                keep_staging = True
                raise OutputError(
                    f"{target.path}: could not move the model into place ({_reason(error)}), nor put the "
                    f"replaced package back; it is kept at {error.parked}: move it back to {target.path}"
                ) from None
            except OSError as error:
                raise OutputError(f"{target.path}: could not move the model into place ({_reason(error)})") from None
            linked.clear()  # now referenced by the model in place
            FILESYSTEM.sync_directory(parent)
            for old in obsolete:
                _remove_or_warn(old, "the replaced model's data file, which nothing references now", warn)
    finally:
        with _signals_deferred():
            for path in linked:
                _remove_or_warn(path, "a data file written for an output that was not put in place", warn)
            if not keep_staging:
                _remove_tree_or_warn(staging, warn)


def _remove_or_warn(path: Path, what: str, warn: Callable[[str], None]) -> None:
    try:
        FILESYSTEM.remove(path)
    except FileNotFoundError:
        pass  # already gone: nothing is left behind
    except OSError as error:
        warn(f"could not remove {path} ({_reason(error)}); it is {what}, and safe to delete")


def _remove_tree_or_warn(staging: Path, warn: Callable[[str], None]) -> None:
    reason = None
    try:
        FILESYSTEM.remove_tree(staging)
    except OSError as error:
        reason = _reason(error)
    # Looked at whatever the removal said: a partial removal may report nothing.
    if os.path.lexists(staging):
        because = f" ({reason})" if reason else ""
        warn(f"could not remove the staging folder {staging}{because}; nothing in it is needed, "
             "and it is safe to delete")


def _make_staging(parent: Path) -> Path:
    try:
        return Path(FILESYSTEM.make_staging(parent))
    except OSError as error:
        raise OutputError(f"{parent}: cannot write here ({_reason(error)})") from None


def _install(staged: Path, target: Target, staging: Path) -> None:
    if not target.package:
        FILESYSTEM.replace(staged, target.path)
        return
    # Two runs may race for one package: re-look at what is there on each try.
    for _ in range(8):
        try:
            if os.path.lexists(target.path):
                FILESYSTEM.exchange(staged, target.path)  # the old package lands in staging
            else:
                FILESYSTEM.rename_new(staged, target.path)
            return
        except (FileExistsError, FileNotFoundError):
            continue
        except OSError as error:
            if error.errno == errno.ENOTEMPTY:
                continue
            raise
    raise OutputError(f"{target.path}: another process keeps replacing it; not written")


def _set_modes(staged: Path, companions: Iterable[Path], target: Target) -> None:
    """Modes as a plain `open` would give them, or the replaced file's.

    The staging folder comes from `mkdtemp` (0700), and libraries that build
    in temporary folders leave 0600 files; neither is what the user expects.
    """
    umask = _umask()
    file_mode, folder_mode = 0o666 & ~umask, 0o777 & ~umask
    if target.replaces:
        with contextlib.suppress(OSError):
            replaced = stat.S_IMODE(os.stat(target.path).st_mode)
            if target.package:
                folder_mode = replaced
            else:
                file_mode = replaced
    if staged.is_dir():
        for root, folders, files in os.walk(staged):
            os.chmod(root, folder_mode)
            for name in files:
                os.chmod(os.path.join(root, name), 0o666 & ~umask)
            for name in folders:
                os.chmod(os.path.join(root, name), 0o777 & ~umask)
        os.chmod(staged, folder_mode)
    else:
        os.chmod(staged, file_mode)
    for companion in companions:
        os.chmod(companion, file_mode)


def _umask() -> int:
    # Reading the umask means setting it; the CLI runs one thread.
    current = os.umask(0o022)
    os.umask(current)
    return current


def _sync_tree(root: Path) -> None:
    """Flush the staged files, so that after a crash the rename never points at empty data."""
    for folder, _, files in os.walk(root):
        for name in files:
            FILESYSTEM.sync_file(Path(folder) / name)


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# ------------------------------------------------------------------ signals


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt, a request, not an error
    """SIGTERM or SIGHUP arrived; unwinds like KeyboardInterrupt, so cleanups run."""

    def __init__(self, signal_number: int):
        super().__init__(signal_number)
        self.signal_number = signal_number


_TERMINATING = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s)


@contextlib.contextmanager
def terminating_signals_unwind() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (SIGINT already
    raises KeyboardInterrupt), so `finally` clauses remove staged files."""
    if not _is_main_thread():  # signal handlers can only be set from the main thread
        yield
        return

    def raise_terminated(number, frame):
        raise Terminated(number)

    previous = {number: signal.signal(number, raise_terminated) for number in _TERMINATING}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the few renames that must run together.

    A signal that arrives meanwhile is recorded, and acted on as its own
    handler would (KeyboardInterrupt, `Terminated`, or the default action)
    once the block is done. Python runs signal handlers in the main thread
    whatever thread the kernel picked, so masking the signals (which
    libraries' worker threads would not share) would not hold them.
    """
    if not _is_main_thread():
        yield
        return
    held: list[int] = []
    numbers = (signal.SIGINT, *_TERMINATING)
    previous = {number: signal.signal(number, lambda number, frame: held.append(number)) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in held[:1]:
            handler = previous[number]
            if callable(handler):
                handler(number, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(number)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------- filesystem


class Filesystem:
    """The few filesystem steps a publish takes, one method each.

    Tests replace `FILESYSTEM` to stop the process at any step.
    """

    def make_staging(self, parent: Path) -> str:
        return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)

    def link_new(self, source: Path, destination: Path) -> None:
        """Give `source` a second name, failing if that name exists."""
        try:
            os.link(source, destination)
        except OSError as error:
            if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            self.rename_new(source, destination)  # a filesystem without hard links

    def replace(self, source: Path, destination: Path) -> None:
        os.replace(source, destination)

    def rename_new(self, source: Path, destination: Path) -> None:
        """Rename, failing with FileExistsError if `destination` exists."""
        if not _rename_flags(source, destination, _NOREPLACE):
            if os.path.lexists(destination):  # no atomic way here; the check is the best we have
                raise FileExistsError(errno.EEXIST, "exists", str(destination))
            os.rename(source, destination)

    def exchange(self, source: Path, destination: Path) -> None:
        """Swap two paths atomically (the old `destination` ends at `source`)."""
        if _rename_flags(source, destination, _EXCHANGE):
            return
        # No atomic exchange on this system or filesystem: two renames, the
        # old package parked beside the new one until the second is done.
        parked = source.with_name(source.name + ".replaced")
        os.rename(destination, parked)
        try:
            os.rename(source, destination)
        except OSError as error:
            try:
                os.rename(parked, destination)
            except OSError:
                raise ReplacedPackageStranded(error, parked) from error
            raise
        os.rename(parked, source)

    def remove(self, path: Path) -> None:
        os.unlink(path)

    def remove_tree(self, path: Path) -> None:
        """Remove as much of `path` as can be; raise the first error if some of it stays."""
        errors: list[OSError] = []

        def record(function, name, error) -> None:
            error = error if isinstance(error, BaseException) else error[1]  # onexc gives it, onerror a triple
            if not isinstance(error, FileNotFoundError):
                errors.append(error)

        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=record)
        else:
            shutil.rmtree(path, onerror=record)
        if errors and os.path.lexists(path):
            raise errors[0]

    def sync_file(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

    def sync_directory(self, path: Path) -> None:
        self.sync_file(path)


FILESYSTEM = Filesystem()

_NOREPLACE, _EXCHANGE = "noreplace", "exchange"


def _rename_flags(source: Path, destination: Path, how: str) -> bool:
    """renameat2 (Linux) or renamex_np (macOS); False if neither can do it here."""
    function, flags = _RENAME_FUNCTIONS.get(how, (None, 0))
    if function is None:
        return False
    arguments = (os.fsencode(source), os.fsencode(destination))
    if sys.platform == "darwin":
        result = function(*arguments, flags)
    else:
        at_cwd = -100
        result = function(at_cwd, arguments[0], at_cwd, arguments[1], flags)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # this filesystem cannot; fall back
    raise OSError(code, os.strerror(code), str(destination))


def _rename_functions() -> dict[str, tuple[Callable | None, int]]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return {}
    if sys.platform == "darwin":
        function = getattr(libc, "renamex_np", None)
        return {_NOREPLACE: (function, 0x4), _EXCHANGE: (function, 0x2)}  # RENAME_EXCL, RENAME_SWAP
    function = getattr(libc, "renameat2", None)
    if function is not None:
        function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    return {_NOREPLACE: (function, 1), _EXCHANGE: (function, 2)}  # RENAME_NOREPLACE, RENAME_EXCHANGE


_RENAME_FUNCTIONS = _rename_functions()
