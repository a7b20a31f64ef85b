"""The hold arithmetic the deployment tests assert with (tests/support/slurm_cluster.py), on made-up
lease timelines ([request, acquired, released, tag] rows, ns)."""
from __future__ import annotations

from slurm_cluster import handoffs, holds, overlapping_holds


def ev(*spans: tuple[int, int]) -> list[list[int]]:
    return [[1000 + start, 1000 + start, 1000 + end, 1] for start, end in spans]


def test_holds_skip_unfinished_events() -> None:
    assert holds([[1, 2, 5, 1], [6, 7, 0, 2], [8, 0, 0, 1]]) == [(2, 5)]


def test_alternating_holds_do_not_overlap() -> None:
    jobs = {"A": ev((0, 10), (20, 30), (40, 50)), "B": ev((10, 20), (30, 40))}
    assert overlapping_holds(jobs) == {"holds": 5, "overlapped": 0, "pairs": 0}
    assert handoffs(jobs) == 4


def test_overlaps_count_holds_of_different_jobs_only() -> None:
    # A's holds overlap each other (one job's own timeline: not counted); B's one hold
    # overlaps both of A's.
    jobs = {"A": ev((0, 10), (5, 12)), "B": ev((8, 20))}
    assert overlapping_holds(jobs) == {"holds": 3, "overlapped": 3, "pairs": 2}
    # a long hold overlapping later holds it does not start next to
    jobs = {"A": ev((0, 100)), "B": ev((10, 20), (30, 40), (150, 160))}
    assert overlapping_holds(jobs) == {"holds": 4, "overlapped": 3, "pairs": 2}


def test_touching_holds_do_not_overlap() -> None:
    assert overlapping_holds({"A": ev((0, 10)), "B": ev((10, 20))})["overlapped"] == 0
    assert overlapping_holds({}) == {"holds": 0, "overlapped": 0, "pairs": 0}


def test_a_checkout_under_a_job_private_directory_is_named():
    """Under job_container/tmpfs a job sees its own /tmp and /dev/shm: a checkout there is
    invisible inside the jobs, so the Slurm tests skip, naming it."""
    import pathlib

    from slurm_cluster import hidden_from_jobs
    assert hidden_from_jobs([pathlib.Path("/tmp/clone"), pathlib.Path("/var/tmp/clone"),
                             pathlib.Path("/dev/shm/x")]) == ["/tmp/clone", "/dev/shm/x"]
