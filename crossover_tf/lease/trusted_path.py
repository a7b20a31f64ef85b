"""The trust rule for a cache whose contents this process runs (the op cache's library,
scripts/install.sh's Horovod wheels): only root and this user may change it.

It is the lease directory's private-mode rule (ops/core/lease_dir.cc, PrivateProblem and
LinkProblem), checked in Python on the path one component at a time: every folder root's or
this user's and not writable by its group or others unless sticky (as /tmp), a symbolic link
followed only if root or this user owns it, and a file to load or install a regular file of
root's or this user's that nobody else may write. A cache another user could change (one they
made first under /tmp, or one shared by several users) would let them run code as whoever uses
it next, so it is refused, naming the path, and never repaired.

`python -m crossover_tf.lease.trusted_path FOLDER` checks a wheel folder for install.sh.
"""
from __future__ import annotations

import os
import pathlib
import pwd
import stat as statmod
import sys
from typing import Callable

MAX_LINKS = 40  # as the kernel's ELOOP bound

FIX = ("use a cache folder of your own: set CROSSOVER_CACHE to one made with `install -d -m "
       "0700 DIR`, every folder above it root's or yours and not writable by others unless "
       "sticky (`chmod go-w` or `chmod +t`); or remove what another user made there")


class UntrustedPathError(PermissionError):
    """A component of a cache path another user could change; `problem` says which and why."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def owner_text(uid: int) -> str:
    """A uid as a message names it: its number and, where known, its name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def refusal(what: str, path: os.PathLike | str, problem: str) -> str:
    """The refusal's text: the path, what is wrong with it, why it matters and the fix."""
    return (f"{what} {path} fails the trust rule: {problem}. Another user who can change it "
            f"could run their code as this user (docs/lease.md). Fix: {FIX}")


def _describe(path: os.PathLike | str, st: os.stat_result) -> str:
    return (f"{path} (owner {owner_text(st.st_uid)}, mode "
            f"{statmod.S_IMODE(st.st_mode):04o})")


def _owner_problem(path: os.PathLike | str, st: os.stat_result, me: int) -> str:
    if st.st_uid in (0, me):
        return ""
    return f"{_describe(path, st)} is owned by neither root nor this user ({owner_text(me)})"


def dir_problem(path: os.PathLike | str, st: os.stat_result, me: int | None = None) -> str:
    """Why a folder on a trusted path is not safe ("" if it is): the C++ PrivateProblem."""
    me = os.geteuid() if me is None else me
    problem = _owner_problem(path, st, me)
    if not problem and st.st_mode & (statmod.S_IWGRP | statmod.S_IWOTH) and not (
            st.st_mode & statmod.S_ISVTX):
        problem = (f"{_describe(path, st)} is writable by its group or by others and is not "
                   "sticky, so they could replace what it holds")
    return problem


def file_problem(path: os.PathLike | str, st: os.stat_result, me: int | None = None) -> str:
    """Why a file to load, install or lock is not safe ("" if it is): an lstat of a regular
    file, root's or this user's, that neither its group nor others may write."""
    me = os.geteuid() if me is None else me
    if not statmod.S_ISREG(st.st_mode):
        return f"{_describe(path, st)} is not a regular file (a symbolic link is not followed)"
    problem = _owner_problem(path, st, me)
    if not problem and st.st_mode & (statmod.S_IWGRP | statmod.S_IWOTH):
        problem = f"{_describe(path, st)} is writable by its group or by others"
    return problem


def _lstat(path: pathlib.Path, create: bool) -> os.stat_result | None:
    """path's lstat; None if it is missing, unless create: then made first (0755, so a umask
    of 002 gives no group write the rule would refuse)."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:   # someone made it first: checked as found
        pass
    return os.lstat(path)


# Sees each component's lstat before it is used: (the folder holding it, the component, its
# lstat, the links followed so far counting this one if it is a link); raises to refuse it.
Visit = Callable[[pathlib.Path, pathlib.Path, os.stat_result, int], None]


def resolve_components(path: os.PathLike | str, visit: Visit,
                       create: bool = False) -> pathlib.Path | None:
    """path resolved one component at a time, links followed by hand so that `visit` judges
    every component, and every link before it is followed, as the C++ core walks the lease
    directory (ops/core/lease_dir.h): a link anyone else owns could be re-pointed between two
    resolutions. None where a component is missing (create: missing folders are made)."""
    todo = list(reversed(pathlib.Path(path).absolute().parts[1:]))
    current, links = pathlib.Path("/"), 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent
            continue
        candidate = current / name
        st = _lstat(candidate, create)
        if st is None:
            return None
        is_link = statmod.S_ISLNK(st.st_mode)
        links += is_link
        visit(current, candidate, st, links)
        if not is_link:
            current = candidate
            continue
        target = pathlib.PurePosixPath(os.readlink(candidate))
        if target.is_absolute():
            current = pathlib.Path("/")
        todo.extend(reversed([part for part in target.parts if part != "/"]))
    return current


def trusted_dir(path: os.PathLike | str, create: bool = False) -> pathlib.Path | None:
    """path resolved, each folder on it checked before its entries are trusted (dir_problem)
    and each link followed only if root or this user owns it; None where a component is
    missing (create: missing folders are made). Raises UntrustedPathError, or
    NotADirectoryError where a component is something else."""
    me = os.geteuid()
    _raise_if(dir_problem("/", os.lstat("/"), me))

    def visit(parent: pathlib.Path, candidate: pathlib.Path, st: os.stat_result,
              links: int) -> None:
        if statmod.S_ISLNK(st.st_mode):
            _raise_if(_link_problem(candidate, st, me, links))
        elif not statmod.S_ISDIR(st.st_mode):
            raise NotADirectoryError(f"{candidate} is not a folder")
        else:
            _raise_if(dir_problem(candidate, st, me))

    return resolve_components(path, visit, create)


def _link_problem(link: pathlib.Path, st: os.stat_result, me: int, links: int) -> str:
    """Why a link may not be followed ("" if it may): the C++ LinkProblem."""
    if st.st_uid not in (0, me):
        return (f"{link} is a symbolic link owned by {owner_text(st.st_uid)}, who is neither "
                f"root nor this user ({owner_text(me)}): its owner could point it elsewhere")
    if links > MAX_LINKS:
        return f"more than {MAX_LINKS} symbolic links on the path (a loop?) at {link}"
    return ""


def _raise_if(problem: str) -> None:
    if problem:
        raise UntrustedPathError(problem)


def check_folder(folder: os.PathLike | str) -> pathlib.Path:
    """folder's parent checked (and made where missing), then folder, where it exists, and
    every entry in it: the files one installs from folder are then root's or this user's."""
    folder = pathlib.Path(folder)
    parent = trusted_dir(folder.parent, create=True)
    found = trusted_dir(parent / folder.name)
    for entry in sorted(found.iterdir()) if found is not None else []:
        st = os.lstat(entry)
        _raise_if(dir_problem(entry, st) if statmod.S_ISDIR(st.st_mode) else
                  file_problem(entry, st))
    return parent / folder.name


def main(argv: list[str]) -> int:
    """install.sh's check of its Horovod wheel folder: 0 if trusted, 2 (and why) if not."""
    if len(argv) != 1:
        print("usage: python -m crossover_tf.lease.trusted_path FOLDER", file=sys.stderr)
        return 2
    try:
        check_folder(argv[0])
    except (UntrustedPathError, NotADirectoryError) as err:
        print(refusal("the Horovod wheel cache", argv[0], str(err)), file=sys.stderr)
        return 2
    except OSError as err:
        print(f"cannot use the Horovod wheel cache {argv[0]} ({err}); set CROSSOVER_CACHE to "
              "a folder this user can write", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
