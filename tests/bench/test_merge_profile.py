"""The merge phase's profile of a member's CPU (a missed target is reported with its profile):
the merge timed as the aggregator runs it, with what Redis and the merger spent."""

import re

from redis.asyncio import Redis

from bench.phases import merge
from shared.keys import Keys
from shared.settings import LadderSettings

MEMBERS = 5000


async def test_a_measured_merge_says_what_redis_and_the_merger_spent_a_member(
    redis: Redis, keys: Keys, settings: LadderSettings
) -> None:
    merged = await merge.merge_time(redis, settings.key_prefix, MEMBERS, regions=8)

    view = keys.global_view(merge.MERGE_BOARD.board_id, "alltime", "all")
    assert await redis.zcard(view) == MEMBERS
    assert merged.seconds > 0
    # The merge runs in this process: its CPU is the merger's, and Redis worked too.
    assert merged.merger > 0
    assert merged.redis > 0
    # Its figures as test_the_profile_reads_a_member_s_cpu_in_microseconds reads them; the
    # share Redis was busy is not bounded here: /proc counts CPU in ticks of 10 ms, as long as
    # a fifth of this merge, and every redis-server on the machine counts as Redis.
    profile = merged.profile(MEMBERS)
    pattern = r"Redis \d+\.\d µs, the merger \d+\.\d µs; Redis busy \d+ % of the merge"
    assert re.fullmatch(pattern, profile), profile


def test_the_profile_reads_a_member_s_cpu_in_microseconds() -> None:
    # 100,000 members in 2 s: Redis 1.5 s (15 µs a member, busy 75 %), the merger 0.8 s.
    assert merge.Merged(2.0, 1.5, 0.8).profile(100_000) == (
        "Redis 15.0 µs, the merger 8.0 µs; Redis busy 75 % of the merge"
    )
