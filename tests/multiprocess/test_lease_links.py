"""A link on the lease directory's path cannot split a pair (issue 48, item 2).

Before: the trust rule checked the directory a path resolved to, never the links on the way.
An attacker made /var/tmp/crossover (in a sticky, world-writable parent) a link of their own to
one root-owned 1777 directory; job A held the device there; the attacker re-pointed the link to
a second such directory, and job B acquired at once (`ACQUIRED after 0.000 s`) while A held:
two holders. Now the core walks the path one component at a time and follows a link only if
root or the job's user owns it (the Python side resolves by the same rule), and uses the
directory through the descriptor it opened.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from lease_helpers import as_user, needs_other_users, scratch_base, wait_for
from crossover_tf import lease as lease_lib
from crossover_tf.lease import segments

NOBODY = 65534  # the attacker: a user the user database knows


def _env(lease_dir: pathlib.Path) -> dict[str, str]:
    return {**os.environ, segments.LEASE_DIR_ENV: str(lease_dir),
            segments.SHARED_GROUP_ENV: "0"}


def _as_nobody(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(as_user(NOBODY, (), "sh", "-c", command), capture_output=True,
                          text=True, timeout=30)


def _sticky_dirs(base: pathlib.Path, *names: str) -> list[pathlib.Path]:
    """Root-owned 1777 directories, like /var/tmp and /dev/shm."""
    made = []
    for name in names:
        directory = base / name
        directory.mkdir()
        directory.chmod(0o1777)
        made.append(directory)
    return made


def _acquire(lease_cli: pathlib.Path, group: str, lease_dir: pathlib.Path, out: pathlib.Path,
             timeout_s: float = 1.0) -> subprocess.CompletedProcess:
    return subprocess.run([str(lease_cli), "acquire", group, "dev", str(timeout_s), str(out)],
                          env=_env(lease_dir), capture_output=True, text=True, timeout=60)


@needs_other_users
def test_an_attackers_link_is_refused_and_cannot_split_a_pair(lease_group, lease_cli):
    """The reproduction: both jobs name the attacker's link; the link is re-pointed between
    their opens. Now neither follows it: each is refused, naming the link and its owner, and
    no segment appears in either target."""
    with scratch_base() as base:
        var_tmp, first, second = _sticky_dirs(base, "vartmp", "first", "second")
        link = var_tmp / "crossover"
        planted = _as_nobody(f"ln -s {first} {link}")
        assert planted.returncode == 0, planted
        assert link.lstat().st_uid == NOBODY
        ready = base / "ready"
        job_a = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev", str(ready)],
                                 env=_env(link), stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: ready.exists() or job_a.poll() is not None, 30, "job A")
            assert not ready.exists(), "job A holds the device through another user's link"
            _, a_err = job_a.communicate(timeout=30)
        finally:
            job_a.kill()
            job_a.wait()
        assert job_a.returncode == 2, a_err
        repointed = _as_nobody(f"ln -sfn {second} {link}")
        assert repointed.returncode == 0, repointed
        job_b = _acquire(lease_cli, lease_group, link, base / "b.out")
        for err in (a_err, job_b.stderr):
            for part in (f"crossover lease directory {link}", f"{link} is a symbolic link owned "
                         f"by uid {NOBODY}", "neither root nor this job's user",
                         "two holders at once", "Name the directory itself, not the link"):
                assert part in err, (part, err)
        assert job_b.returncode == 2, job_b
        assert list(first.iterdir()) == [] and list(second.iterdir()) == []
        with pytest.raises(segments.LeaseDirError, match=f"{link} is a symbolic link owned by "
                                                         f"uid {NOBODY}"):
            lease_lib.DeviceLease(lease_group, "dev", lease_dir=link)


@needs_other_users
def test_a_link_root_owns_is_followed_and_keeps_one_holder(lease_group, lease_cli):
    """A link of root's in a sticky directory is safe to follow: nobody else can replace it
    (the sticky bit), so both jobs reach one lease through it; the attacker's attempt to
    re-point it fails, and job B waits behind job A's hold instead of acquiring beside it."""
    with scratch_base() as base:
        var_tmp, first, second = _sticky_dirs(base, "vartmp", "first", "second")
        link = var_tmp / "crossover"
        link.symlink_to(first)
        ready = base / "ready"
        job_a = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev", str(ready)],
                                 env=_env(link))
        try:
            wait_for(ready.exists, 30, "job A's hold")
            assert (first / f"crossover.{lease_group}.dev").exists()
            repointed = _as_nobody(f"ln -sfn {second} {link}")
            assert repointed.returncode != 0, "the sticky bit let another user replace the link"
            assert os.readlink(link) == str(first)
            job_b = _acquire(lease_cli, lease_group, link, base / "b.out", timeout_s=1.0)
            assert job_b.returncode == 0, job_b
            answer = (base / "b.out").read_text()
            assert answer.startswith("error") and "timed out" in answer, answer
            assert list(second.iterdir()) == []
        finally:
            job_a.kill()
            job_a.wait()
        assert segments.resolve_lease_dir(link) == first


@needs_other_users
def test_a_link_further_up_the_path_is_checked_too(lease_group, lease_cli):
    """Every link on the path is checked, not only the last component: a root link to an
    attacker's link is refused at the attacker's; a relative link of root's resolves from its
    own directory; a link loop is an error, not a hang."""
    with scratch_base() as base:
        var_tmp, first = _sticky_dirs(base, "vartmp", "first")
        attackers = var_tmp / "theirs"
        assert _as_nobody(f"ln -s {first} {attackers}").returncode == 0
        (base / "mine").symlink_to(attackers)
        refused = _acquire(lease_cli, lease_group, base / "mine", base / "out")
        assert refused.returncode == 2, refused
        assert f"{attackers} is a symbolic link owned by uid {NOBODY}" in refused.stderr
        with pytest.raises(segments.LeaseDirError, match=f"{attackers} is a symbolic link"):
            segments.resolve_lease_dir(base / "mine")

        (var_tmp / "relative").symlink_to("../first")
        assert segments.resolve_lease_dir(var_tmp / "relative") == first
        took = _acquire(lease_cli, lease_group, var_tmp / "relative", base / "out")
        assert took.returncode == 0, took
        assert (base / "out").read_text().startswith("ok")

        (base / "loop").symlink_to(base / "loop")
        looped = _acquire(lease_cli, lease_group, base / "loop", base / "out")
        assert looped.returncode == 2 and "Too many levels of symbolic links" in looped.stderr
        with pytest.raises(segments.LeaseDirError, match="symbolic links on its path"):
            segments.resolve_lease_dir(base / "loop")


@needs_other_users
def test_an_observer_follows_a_link_of_the_directory_owners(lease_group, lease_cli):
    """status and the exporter read every user's leases: they also follow a link that the
    owner of the directory holding it owns (that owner could change the directory anyway), and
    still refuse another user's link in a sticky directory."""
    with scratch_base() as base:
        (var_tmp,) = _sticky_dirs(base, "vartmp")
        home = base / "home"
        home.mkdir(mode=0o755)
        os.chown(home, NOBODY, NOBODY)
        (home / "leases").mkdir(mode=0o700)
        os.chown(home / "leases", NOBODY, NOBODY)
        assert _as_nobody(f"ln -s {home / 'leases'} {home / 'link'}").returncode == 0
        assert segments.resolve_lease_dir(home / "link", observer=True) == home / "leases"
        with pytest.raises(segments.LeaseDirError, match="is a symbolic link owned by"):
            segments.resolve_lease_dir(home / "link")
        assert _as_nobody(f"ln -s {home / 'leases'} {var_tmp / 'link'}").returncode == 0
        with pytest.raises(segments.LeaseDirError, match="is a symbolic link owned by"):
            segments.resolve_lease_dir(var_tmp / "link", observer=True)


REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SLURM_JOB = REPO_ROOT / "deploy" / "slurm" / "crossover_job.sbatch"


@needs_other_users
def test_the_slurm_recipe_does_not_follow_a_planted_link():
    """Before: the recipe made its default directory with `install -d -m 0700`, which follows a
    link planted at the name and chmods whatever it points at. Now it stops, naming the path,
    and leaves the link's target as it was."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="crossover-links-", dir="/var/tmp"))
    try:  # outside /tmp, which the recipe refuses (private to a job under job_container/tmpfs)
        base.chmod(0o755)
        var_tmp, target = _sticky_dirs(base, "vartmp", "target")
        link = var_tmp / "crossover-0"
        assert _as_nobody(f"ln -s {target} {link}").returncode == 0
        run = subprocess.run(["bash", str(SLURM_JOB), "true"], env=_env(link),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run
        assert f"{link} is not a directory of this user's (a link" in run.stderr, run.stderr
        assert target.stat().st_mode & 0o7777 == 0o1777, "the recipe changed the link's target"
        made = var_tmp / "fresh"
        run = subprocess.run(["bash", str(SLURM_JOB), "true"], env=_env(made),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run
        assert made.is_dir() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(base, ignore_errors=True)
