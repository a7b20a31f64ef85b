"""What a member who can write the segment can break, it breaks loudly (issue 48, item 3).

In group mode every member maps the segment writable (docs/deploying.md, "What group members
can still do"), and so do root and the job's own user in any mode. Two of the things such a
process can do used to leave the other members with the wrong story: a truncated segment
killed them with a bare SIGBUS (exit 135), and a mutex taken without the core's own lock path
made the next open fail after 10 s naming the last process that had recorded itself, not the
one holding the lock. Now the dying members name the segment and what happened, and the stuck
wait names the process the mutex itself says holds it.
"""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess

from lease_helpers import wait_for
from crossover_tf.lease import segments


def _env(lease_dir: pathlib.Path) -> dict[str, str]:
    return {**os.environ, segments.LEASE_DIR_ENV: str(lease_dir),
            segments.SHARED_GROUP_ENV: "0"}


def test_a_truncated_segment_names_itself_as_its_members_die(tmp_path, lease_group, lease_cli):
    """Before: `Bus error`, exit 135, nothing else. Now the member still dies of SIGBUS (no
    access to a truncated mapping can succeed), after a line naming the segment and the
    cause."""
    env = _env(tmp_path)
    path = tmp_path / f"crossover.{lease_group}.dev"
    member = subprocess.Popen([str(lease_cli), "cycles", lease_group, "dev", "10000000", "50",
                               str(tmp_path / "cycles.out")], env=env, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: path.exists() and path.stat().st_size > 0, 30, "the member's segment")
        os.truncate(path, 0)
        _, err = member.communicate(timeout=30)
    finally:
        member.kill()
        member.wait()
    assert member.returncode == -signal.SIGBUS, (member.returncode, err)
    for part in (f"lease segment {path} was truncated while this process had it mapped",
                 "SIGBUS on access", "any member of the lease directory's group",
                 "stop the group's jobs"):
        assert part in err, (part, err)


def test_a_stuck_mutex_names_the_process_that_holds_it(tmp_path, lease_group, lease_cli):
    """Before: job H created the segment (recording itself as the mutex's last taker); process
    P then took the mutex its own way; the next member's open failed after 10 s blaming H. Now
    it names P, and says P did not record itself."""
    env = _env(tmp_path)
    holder = subprocess.Popen([str(lease_cli), "hold", lease_group, "dev",
                               str(tmp_path / "held")], env=env)
    grabber = None
    try:
        wait_for((tmp_path / "held").exists, 30, "job H's hold")
        grabber = subprocess.Popen([str(lease_cli), "grab-lock", lease_group, "dev",
                                    str(tmp_path / "grabbed")], env=env)
        wait_for((tmp_path / "grabbed").exists, 30, "P's grab of the mutex")
        late = subprocess.run([str(lease_cli), "acquire", lease_group, "dev", "1",
                               str(tmp_path / "late.out")], env=env, capture_output=True,
                              text=True, timeout=60)
        message = late.stderr + (tmp_path / "late.out").read_text() if (
            tmp_path / "late.out").exists() else late.stderr
        assert "its internal lock is held by pid " f"{grabber.pid} (its thread {grabber.pid})" \
            in message, message
        assert f"took it without recording itself (the last recorded taker was pid " \
            f"{holder.pid})" in message, message
    finally:
        for proc in (grabber, holder):
            if proc is not None:
                proc.kill()
                proc.wait()
