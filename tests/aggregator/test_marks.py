"""How the merge's marks go to the merge function: by user into calls, each call's in runs of
one region (services/aggregator/marks.py)."""

import random

from services.aggregator.marks import by_user, in_runs
from shared.keys import dirty_member


def mark(region: str, user: str) -> str:
    return dirty_member("alltime", "all", region, user)


def test_a_call_takes_its_marks_in_runs_of_a_region_with_its_count_of_users() -> None:
    marks = [mark("na", "b"), mark("eu", "c"), mark("na", "a"), mark("eu", "a")]
    (chunk,) = by_user(marks, 10)
    args, regions = in_runs(chunk)
    users, count = args[:2]
    assert (users, count) == (3, 2)
    assert args[2 : 2 + count] == regions and sorted(regions) == ["eu", "na"]
    sizes, rest = args[2 + count : 2 + 2 * count], args[2 + 2 * count :]
    runs, at = {}, 0
    for region, size in zip(regions, sizes, strict=True):
        assert isinstance(size, int)
        runs[region], at = rest[at : at + size], at + size
    # Each run holds its region's marks (user a, of both regions, last: its marks together).
    assert runs == {
        "eu": [mark("eu", "c"), mark("eu", "a")],
        "na": [mark("na", "b"), mark("na", "a")],
    }


def test_a_user_s_marks_stay_in_one_call() -> None:
    marks = [mark(region, user) for user in "abcd" for region in ("eu", "na", "ap")]
    calls = list(by_user(marks, 4))
    assert sorted(m for call in calls for _, _, m in call) == sorted(marks)
    for user in "abcd":
        assert sum(any(u == user for u, _, _ in call) for call in calls) == 1


def test_calls_take_the_marks_region_by_region() -> None:
    # Five regions, 40 users each, one mark a user, shuffled as a scan returns them: calls of
    # 20 marks each name one region, so the function reads each region's records in one HMGET.
    marks = [mark(f"r{r}", f"u{r}-{i:02}") for i in range(40) for r in range(5)]
    random.Random(4).shuffle(marks)
    calls = list(by_user(marks, 20))
    assert len(calls) == 10
    for call in calls:
        assert len({region for _, region, _ in call}) == 1
        users = [user for user, _, _ in call]
        assert users == sorted(users)
