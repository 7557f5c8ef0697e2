"""What every output directory records in its `run.json` (versions, commit, device, file hashes),
and how it is written: whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from bertjax import cli
from bertjax.errors import UserError

log = logging.getLogger(__name__)

PACKAGES = ("bertjax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "transformers", "tokenizers", "spacy")  # fmt: skip


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# The sha256 of the bytes that an input reader last parsed from each file (`read_input`), by
# resolved path. A file replaced while a run read it was recorded under the other version's sha256
# when run.json hashed the file again at the end (probe 2.10).
_PARSED: dict[Path, str] = {}


# The largest input file a reader takes whole (the staged QNLI train TSV is ~30 MB): a bound that
# keeps a mistaken path (a disk image, a log) from filling the memory before anything is said.
MAX_INPUT_BYTES = 1 << 30


def read_input(path: Path) -> bytes:
    """The bytes of the input file `path`, read once: the reader parses these, and run.json names
    their sha256 (`input_sha256`), whatever is at `path` by then. Only a regular file of at most
    `MAX_INPUT_BYTES`: a FIFO would block the read forever and a device (/dev/zero) never end it."""
    with open(path, "rb", opener=_nonblocking) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path}: not a regular file (a pipe, device or directory); give the file itself")
        if info.st_size > MAX_INPUT_BYTES:
            raise UserError(
                f"{path}: {info.st_size / 2**30:.1f} GiB, over the {MAX_INPUT_BYTES >> 30} GiB an input file may be"
            )
        data = f.read(MAX_INPUT_BYTES + 1)
    _PARSED[Path(path).resolve()] = hashlib.sha256(data).hexdigest()
    return data


def _nonblocking(path, flags: int) -> int:
    """Opens without waiting for a FIFO's writer (the check that follows refuses it)."""
    return os.open(path, flags | os.O_NONBLOCK)


def input_sha256(path: Path) -> str:
    """The sha256 of the bytes last parsed from `path` (`read_input`); of the file as it is now
    where no reader took it through `read_input`."""
    return _PARSED.get(Path(path).resolve()) or sha256(path)


def _git_output(*args: str) -> bytes | None:
    """What `git ARGS` run in this checkout prints, as bytes; None if git fails or is missing."""
    try:
        out = subprocess.run(
            # --no-optional-locks: `git status` would otherwise refresh the index under
            # .git/index.lock, colliding with the user's own git commands while a run starts (and
            # leaving the lock behind when killed, as a full disk's SIGXFSZ does).
            ["git", "--no-optional-locks", *args],
            cwd=Path(__file__).parent,
            capture_output=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _git(*args: str) -> str | None:
    out = _git_output(*args)
    return None if out is None else out.decode(errors="replace").strip()


def git_commit() -> str | None:
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether the checkout differs from its commit (then the commit alone does not say what ran);
    None outside a checkout."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def git_diff_sha256() -> str | None:
    """The sha256 of `git diff HEAD --binary` (the tracked files' uncommitted changes; external
    diff drivers, text conversion and colour off, so the same tree hashes the same for any user's
    git config): with the commit, it names the code that ran. None when the checkout is clean or
    this is not one."""
    diff = _git_output("diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv", "--no-color")
    return hashlib.sha256(diff).hexdigest() if diff else None


def versions() -> dict[str, str | bool | None]:
    found: dict[str, str | bool | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["git_commit"] = git_commit()
    found["git_dirty"] = git_dirty()
    found["git_diff_sha256"] = git_diff_sha256()
    return found


def environment() -> dict[str, Any]:
    import jax

    devices = jax.devices()
    return {
        "versions": versions(),
        "devices": {"count": len(devices), "kind": devices[0].device_kind, "platform": devices[0].platform},
        "processes": jax.process_count(),
        "host": platform.node(),
        "command": sys.argv,
        # Paths in the settings are as typed; relative ones are relative to this.
        "cwd": os.getcwd(),
    }


def write_run_json(directory: Path, info: dict[str, Any]) -> None:
    """Atomically writes `run.json` (the settings and timings given, plus the environment)."""
    with atomic_file(Path(directory) / "run.json", overwrite=True) as f:  # a phase's replaces the last's
        f.write(json.dumps({**info, **environment()}, indent=2, default=str) + "\n")


# Writing files where someone else may have put a symbolic link, or a file of their own. Every file
# the tools write goes through these (or into a directory made by `atomic_out`), so that a link
# planted in a shared folder (`ln -s ~/victim .out.lock`) is refused, never written through, and a
# file the user named is replaced only when they asked for it.


def refuse_symlink(path: Path) -> None:
    """One line if `path` is a symbolic link, where a file of ours is to be written."""
    if Path(path).is_symlink():
        raise UserError(f"{path} is a symbolic link; refusing to write through it (remove it, or choose another path)")


def check_writable(path: Path, overwrite: bool) -> None:
    """One line if `path` cannot take a new file: a link, a directory, or (without `overwrite`) a file."""
    refuse_symlink(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory; name the file to write")
    if path.exists() and not overwrite:
        raise UserError(f"{path} exists; it is left as it is (pass overwrite=True to replace it)")


@contextlib.contextmanager
def atomic_file(path: str | Path, binary: bool = False, overwrite: bool = False) -> Iterator[IO]:
    """A new file to write `path`'s content into, moved to `path` when the block completes and
    removed if it raises: `path` is whole or as it was. The temporary beside `path` has a random
    name and is created with O_EXCL (`mkstemp`), so no link planted in advance can be followed; a
    link at `path` itself is refused. An existing `path` is replaced only with `overwrite` (the
    callers pass it for files they made themselves: a workdir's config, a cache entry); without it,
    a file that appears at `path` while the content is written is kept too (a hard link, which
    cannot replace anything, puts the temporary in place)."""
    path = Path(path)
    check_writable(path, overwrite)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600: the file gets the mode any new file would
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, path: Path) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        check_writable(path, overwrite=False)  # the one line saying what is there now
        raise
    except OSError as e:
        # A file system without hard links (FAT, some network mounts): checked, then renamed.
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        check_writable(path, overwrite=False)
        os.replace(tmp, path)


def open_append(path: str | Path) -> IO[str]:
    """`path` opened for appending text (created if absent), refusing a symbolic link (O_NOFOLLOW)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_symlink(path)
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


@contextlib.contextmanager
def log_write(path: str | Path, what: str) -> Iterator[None]:
    """A write to a run's logs (`what`: "the training metrics"): a failure (a full disk) stops
    the run with one line naming the file, as a UserError."""
    try:
        yield
    except OSError as e:
        raise UserError(f"cannot write {what} to {path} ({e.strerror}); stopping") from None


# Names what made an output directory, so that --overwrite can tell an earlier output of the same
# kind from anything else that holds a run.json (a training workdir does). Each tool names its own
# kind ("roles output", "track output", ...): a roles run's --overwrite once replaced a track
# output. ANALYSIS_OUTPUT is the one kind every analysis wrote before; it replaces no tool's now.
OUTPUT_MARKER = ".bertjax-output"
ANALYSIS_OUTPUT = "analysis output"


@contextlib.contextmanager
def atomic_out(out: str | Path, overwrite: bool = False, kind: str = ANALYSIS_OUTPUT) -> Iterator[Path]:
    """A temporary directory beside `--out` to write into; renamed to `--out` when the block
    completes, removed if it raises, so an output directory is never half-written. Checks that
    `--out` can be written before any work starts. `overwrite` replaces an earlier output of the
    same `kind` (marked so by this function) and nothing else, so a mistyped `--out` cannot delete a
    training run or a folder of other files.

    One run at a time writes a given `--out` (a second one is refused at its start), and the checks
    are made again when the output is moved in: a directory that appeared at `--out` meanwhile is
    left as it is. Temporaries of this `kind` left by a killed run are removed by the next one."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there ({e.strerror})") from None
    with exclusive(out):
        _check_replaceable(out, overwrite, kind)
        _remove_stale_temporaries(out, kind)
        tmp = None
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP}{os.getpid()}-", dir=out.parent))
            # mkdtemp makes it private (0700); the output gets the mode any new directory would.
            tmp.chmod(0o777 & ~_umask())
            (tmp / OUTPUT_MARKER).write_text(kind + "\n")  # in the directory just made
        except OSError as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise UserError(f"--out {out}: cannot write there ({e.strerror})") from None
        try:
            yield tmp
            cli.stop_if_terminated()  # a terminated run's output is not moved in
            with _signals_deferred():
                _move_in(tmp, out, overwrite, kind)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno in _NO_SPACE:
                # A copy's error names its source first (shutil.copyfile): the file written is the second.
                where = e.filename2 or e.filename or "the output"
                if Path(where).is_relative_to(tmp):  # the temporary is gone: name where it would be
                    where = out / Path(where).relative_to(tmp)
                raise UserError(f"no space left writing {where} ({e.strerror}); --out {out} was not written") from None
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


# A full disk, a quota, a file-size limit: what the user can fix by making room.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def no_space(error: BaseException) -> str | None:
    """The reason (`os.strerror`) when `error`, or an exception it was raised from, is a write
    that failed for lack of room; None otherwise. TensorStore (orbax's array writes) raises a
    ValueError whose text carries the errno as `[os_error_code='28']`, the tokenizers library a bare
    Exception reading Rust's `File too large (os error 27)`."""
    seen = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError) and link.errno in _NO_SPACE:
            return link.strerror
        for code in _NO_SPACE:
            if f"[os_error_code='{code}']" in str(link) or f"(os error {code})" in str(link):
                return os.strerror(code)
        link = link.__cause__ or link.__context__
    return None


# A temporary is `.<out name>.tmp-<pid>-<random>`: the pid tells a killed run's from a live one's.
_TMP = ".tmp-"


def check_out(out: str | Path, overwrite: bool) -> None:
    """`atomic_out`'s first refusals (a file, or a non-empty directory without `overwrite`), for a
    command to make before its heavy imports; `atomic_out` checks again, and the output's kind."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"--out {out} is not empty; pass --overwrite to replace it")


def _check_replaceable(out: Path, overwrite: bool, kind: str) -> None:
    check_out(out, overwrite)
    if out.is_dir() and any(out.iterdir()):
        marked = _marked(out)
        if marked is None:
            raise UserError(
                f"--out {out} is not an earlier {kind} (it has no {OUTPUT_MARKER} saying so); --overwrite replaces only those"
            )
        if marked == ANALYSIS_OUTPUT != kind:
            raise UserError(
                f"--out {out} is an analysis output of an earlier bertjax, which did not record which tool made it; "
                f"--overwrite replaces only an earlier {kind} (remove it yourself, or choose another --out)"
            )
        if marked != kind:
            raise UserError(
                f"--out {out} holds another kind of output ({marked}), not an earlier {kind}; --overwrite replaces "
                "only an output of the same kind (choose another --out)"
            )


def _marked(directory: Path) -> str | None:
    try:
        return (directory / OUTPUT_MARKER).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _move_in(tmp: Path, out: Path, overwrite: bool, kind: str) -> None:
    """Renames `tmp` to `out`, replacing only what `_check_replaceable` allows as `out` is now."""
    try:
        os.rename(tmp, out)  # atomic, and replaces nothing but an empty directory
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise UserError(f"--out {out}: cannot write there ({e.strerror})") from None
    try:
        _check_replaceable(out, overwrite, kind)
    except UserError:
        raise UserError(
            f"--out {out} was created by something else while this run wrote its output; "
            "it is left as it is and this run's output is discarded"
        ) from None
    # Aside first, so that no moment has neither the old output nor the new one complete.
    aside = tmp.with_name(tmp.name + "-replaced")
    os.rename(out, aside)
    os.rename(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def exclusive(out: Path, flag: str = "--out") -> Iterator[None]:
    """Holds `.<out name>.lock` beside `out` (a `flock`, which the kernel releases however the
    process ends), or refuses with one line naming the process that holds it. `flag` names `out`
    in the messages (`--out`, `--workdir`). The lock file is opened with O_NOFOLLOW: a symbolic link
    planted there is refused, never truncated through."""
    lock = out.with_name(f".{out.name}.lock")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UserError(
                    f"{flag} {out}: its lock {lock} is a symbolic link; refusing to write through it (remove it)"
                ) from None
            raise UserError(f"{flag} {out}: cannot write there ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise UserError(
                f"{flag} {out} is being written by another run{f' (pid {holder})' if holder else ''}; "
                f"wait for it to end or choose another {flag}"
            ) from None
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:  # else its last holder removed it after we opened it: lock the new one
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def one_writer(workdir: str | Path, flag: str = "--workdir") -> Iterator[None]:
    """One run at a time writes a training `workdir` (the `exclusive` lock beside it, as `--out`
    has). A workdir this run created is removed again if the run is refused (a UserError), so a
    refusal leaves nothing behind, and so are the parent folders it created while they are empty:
    another run may have put its own workdir beside this one meanwhile. An interrupted or preempted
    run keeps its checkpoints."""
    workdir = Path(workdir).expanduser().resolve()
    created = [p for p in [workdir, *workdir.parents] if not p.exists()]  # deepest first
    try:
        workdir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag} {workdir}: cannot write there ({e.strerror})") from None
    locked = False
    try:
        with exclusive(workdir, flag):
            locked = True
            yield
    except UserError:
        # Not when the lock was refused: the workdir is then the other run's. Nor when it has
        # trained: a refusal after a checkpoint (a full disk) keeps what it cost, a fine-tuning
        # seed's in seed-<n>/checkpoints too.
        if locked and workdir in created and not any(workdir.rglob("checkpoints/[0-9]*")):
            shutil.rmtree(workdir, ignore_errors=True)
        for parent in created[1:]:
            try:
                parent.rmdir()  # only while empty
            except OSError:
                break
        raise


def _remove_stale_temporaries(out: Path, kind: str) -> None:
    """Removes temporaries of `out` that a killed run of this `kind` left (its pid is gone); called
    with the lock held, so no live run of this version is writing one."""
    for path in out.parent.glob(f".{glob.escape(out.name)}{_TMP}*"):
        pid = path.name[len(out.name) + 1 + len(_TMP) :].split("-")[0]
        if not pid.isdigit() or path.is_symlink() or not path.is_dir() or _alive(int(pid)):
            continue
        # An empty one was killed before it wrote its marker.
        if _marked(path) == kind or not any(path.iterdir()):
            log.info("removing %s, left by a run (pid %s) that was killed", path, pid)
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Holds Ctrl-C and SIGTERM while the output is moved in, so that the move is not cut between
    its renames; they are delivered when it is done."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
