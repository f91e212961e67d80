"""The episode worker's pages copied ahead of a cell (``snapshots.HotPages``), on this process:
the page map shows the pages written since a fork, and copying them ahead writes nothing.
(``test_appworld.py`` checks the effect in a worker: a cell after a policy's turn faults on
almost none of its pages.)"""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from sage_rl.integrations.appworld import snapshots
from sage_rl.integrations.appworld.snapshots import PAGE, HotPages, written_ranges

pytestmark = pytest.mark.skipif(
    tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 14),
    reason="MADV_POPULATE_WRITE needs Linux 5.14",
)


def _pages(buf: mmap.mmap) -> tuple[int, int]:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf)


def _written_pages(hot: HotPages, start: int, size: int) -> set[int]:
    """Page numbers within [start, start + size) in this process's written runs."""
    found = set()
    for address, length in written_ranges(*hot._fds):  # type: ignore[misc]
        for page in range(address, address + length, PAGE):
            if start <= page < start + size:
                found.add((page - start) // PAGE)
    return found


def _with_a_copy(fn):
    """Run ``fn()`` while a forked copy of this process holds its pages (as a snapshot does)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        return fn()
    finally:
        os.close(write_end)
        os.waitpid(pid, 0)


def test_the_page_map_shows_the_pages_written_since_a_fork_and_copying_them_ahead_writes_nothing() -> None:
    buf = mmap.mmap(-1, 32 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(32):
        buf[i * PAGE] = i + 1  # every page present, with its own content
    start, size = _pages(buf)
    hot = HotPages()
    hot.open()
    try:

        def write_some() -> set[int]:
            assert _written_pages(hot, start, size) == set()  # right after a fork: all shared
            for i in (3, 10, 11, 12):
                buf[i * PAGE + 1] = 0xAA
            return _written_pages(hot, start, size)

        assert _with_a_copy(write_some) == {3, 10, 11, 12}
        # Learn those pages (here by hand: the worker learns after a cell that ran unhelped), then
        # after the next fork copy them ahead: they are this process's own again, unchanged.
        hot.ranges = [(start + 3 * PAGE, PAGE), (start + 10 * PAGE, 3 * PAGE)]

        def copy_ahead() -> set[int]:
            hot._forks = 0
            hot.after_fork(lambda: False)
            return _written_pages(hot, start, size)

        before = bytes(buf)
        assert _with_a_copy(copy_ahead) == {3, 10, 11, 12}
        assert bytes(buf) == before
        # A request already waiting stops the copies before the first run.
        hot._forks = 0
        assert (
            _with_a_copy(lambda: (hot.after_fork(lambda: True), _written_pages(hot, start, size))[1]) == set()
        )
    finally:
        hot.close()
        buf.close()


def test_the_open_page_map_shows_no_physical_page_numbers() -> None:
    """The worker opens it as root (before dropping to nobody); agent code can read the open file."""
    buf = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf[0] = 1
    hot = HotPages()
    hot.open()
    try:
        assert hot._fds is not None
        entry = int.from_bytes(os.pread(hot._fds[1], 8, _pages(buf)[0] // PAGE * 8), "little")
        assert entry >> 63 == 1 and entry & ((1 << 55) - 1) == 0  # present; no page frame number
    finally:
        hot.close()
        buf.close()


def test_agent_code_swapping_the_page_maps_descriptors_turns_copying_ahead_off_not_the_worker(
    tmp_path,
) -> None:
    """Agent code runs in the worker: it can close the open page map and open its own file under
    the same number (the lowest free one), e.g. one claiming that every page was written."""
    fake = tmp_path / "fake"
    fake.write_bytes(b"\x81" * 4096)
    hot = HotPages()
    hot.open()
    assert hot._fds is not None
    maps, pagemap = hot._fds
    os.close(pagemap)
    assert os.open(fake, os.O_RDONLY) == pagemap
    try:
        hot._forks, hot._helped = 1, False
        hot.before_fork()  # learns nothing from the impostor, raises nothing
        assert hot._fds is None and hot.ranges == []
        hot.after_fork(lambda: False)
        assert not hot._helped
        os.fstat(pagemap)  # the impostor's file is left open: it is agent code's now
    finally:
        os.close(pagemap)
        os.close(maps)


def test_every_relearn_th_fork_copies_nothing_ahead_so_the_next_cell_is_learned() -> None:
    hot = HotPages()
    hot.ranges = [(0, PAGE)]  # an unmapped page: madvise fails, harmlessly
    helped = []
    for _ in range(2 * snapshots.RELEARN):
        hot._helped = False
        hot.after_fork(lambda: False)
        helped.append(hot._helped)
    assert helped.count(False) == 2 and helped[snapshots.RELEARN - 1] is False
