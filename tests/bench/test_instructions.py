"""What a write costs Redis in instructions (callgrind), against one submission of the bare loop
R counted alike on the same server: a count, not a time, so the bound holds on any machine and
under any load. The write of main's shape, as the API sends it (behind its rate limits), costs
about 9.7 R's now; 11.0 while each period's result was a table (and its brackets pushed out, and
its JSON parts), 11.5 while the call named the derived views' keys too (the journaled layout, 47
keys where the lean one has 15), 12.3 while each period's arguments were a table of nine keys
and each rate bucket a hash. The write alone (without the limits) cost 12.3 R's before its JSON
was built as a string and its integers printed as integers, 10.9 after, 10.3 then."""

import shutil

import pytest

from bench.phases import instructions
from tests import tools


@pytest.fixture(autouse=True)
def valgrind() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        tools.missing("valgrind is not installed (apt-get install valgrind)")


# As many users as the bench (beyond a listpack's 128 entries: the boards are encoded as a large
# board's are); writes enough for a steady mean, few enough for the suite.
USERS, WRITES = 1000, 300
MOST = 10.2


async def test_a_write_costs_redis_at_most_so_many_bare_submissions() -> None:
    shape = "incr, 4 periods, with teams (like main)"
    async with instructions.counted_redis() as counted:
        baseline = await instructions.per_baseline(counted, USERS, WRITES)
        write = await instructions.per_write(counted, shape, USERS, WRITES)
    assert baseline > 0
    assert write / baseline <= MOST, f"{write:,.0f} instructions a write, {baseline:,.0f} for R"


# A merged member of 5,000, 8 regions: about 0.47 R's new to the global view and 0.42 with its
# score changed; 0.62 and 0.59 before ladder_merge_v6 (its marks in runs of one region, its lean
# read and plan), 0.75 and 0.81 while each user's regions were a set of its own and a changed
# record's scores were parsed to be compared.
MERGED, MERGE_MOST = 5000, 0.52


async def test_a_merged_member_costs_redis_at_most_so_much_of_a_bare_submission() -> None:
    async with instructions.counted_redis() as counted:
        baseline = await instructions.per_baseline(counted, USERS, WRITES)
        new, changed = await instructions.per_merged_member(counted, 8, MERGED)
    for count in (new, changed):
        assert count / baseline <= MERGE_MOST, f"{count:,.0f} instructions, {baseline:,.0f} for R"
