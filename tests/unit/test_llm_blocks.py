"""Block store: chain hashes, reference counts, LRU reuse, no leaks (pure logic, no model)."""

from __future__ import annotations

import pytest

from voicepipe.llm.blocks import BlockManager, OutOfBlocksError
from voicepipe.llm.session import Session

BS = 4


def computed_session(bm: BlockManager, ids: list[int]) -> Session:
    """A session whose ids were all prefilled: reuse cached blocks, allocate the rest, commit."""
    s = Session(ids=list(ids))
    s.attach_prefix(bm)
    assert s.ensure_slots(bm, len(ids))
    s.commit(bm, len(ids) - s.num_cached)
    return s


def drop_all_and_check_no_leak(bm: BlockManager, sessions: list[Session]) -> None:
    for s in sessions:
        s.drop_kv(bm)
    assert bm.num_free == bm.num_blocks
    bm.check()


def test_refcounts_and_free_list():
    bm = BlockManager(8, BS)
    a, b = bm.allocate(), bm.allocate()
    assert bm.num_free == 6 and bm.ref_count[a] == bm.ref_count[b] == 1
    bm.incref(a)
    bm.release(a)
    assert bm.ref_count[a] == 1 and a not in bm.free_order()
    bm.release(a)
    assert bm.ref_count[a] == 0 and a in bm.free_order()
    with pytest.raises(AssertionError):
        bm.release(a)
    bm.check()


def test_allocate_until_empty():
    bm = BlockManager(2, BS)
    bm.allocate()
    bm.allocate()
    with pytest.raises(OutOfBlocksError):
        bm.allocate()


def test_shared_system_prompt_across_three_sessions_uses_one_set_of_blocks():
    bm = BlockManager(64, BS)
    system = list(range(100, 112))  # 3 full blocks
    sessions = [computed_session(bm, system + [i, i + 1, i + 2, i + 3, i + 4]) for i in (1, 20, 40)]
    shared = sessions[0].block_table[:3]
    for s in sessions[1:]:
        assert s.block_table[:3] == shared
        assert s.num_cached == len(s.ids)
    for b in shared:
        assert bm.ref_count[b] == 3
    # each session's own tail blocks are private
    tails = [tuple(s.block_table[3:]) for s in sessions]
    assert len(set(tails)) == 3
    for tail in tails:
        assert all(bm.ref_count[b] == 1 for b in tail)
    # 3 shared + 2 private per session
    assert bm.num_used == 3 + 3 * 2
    assert bm.hit_blocks == 6  # sessions 2 and 3 hit the 3 system blocks each
    drop_all_and_check_no_leak(bm, sessions)


def test_hit_checks_tokens_and_chain():
    bm = BlockManager(16, BS)
    computed_session(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    # same second block but a different first block: the chain differs, so no hit at all
    blocks, _ = bm.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0])
    assert blocks == []
    blocks, _ = bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert len(blocks) == 2


def test_match_never_covers_the_last_token():
    bm = BlockManager(16, BS)
    computed_session(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    s = Session(ids=[1, 2, 3, 4, 5, 6, 7, 8])
    assert s.attach_prefix(bm) == 4  # the block holding the last token is recomputed
    s.drop_kv(bm)


def test_freed_blocks_keep_their_hash_until_reused_in_lru_order():
    bm = BlockManager(6, BS)
    first = computed_session(bm, [1, 2, 3, 4, 0])
    second = computed_session(bm, [5, 6, 7, 8, 0])
    f_block, s_block = first.block_table[0], second.block_table[0]
    first.drop_kv(bm)  # tail first: first's prefix block is freed after its tail
    second.drop_kv(bm)
    order = bm.free_order()
    assert order.index(f_block) < order.index(s_block)  # freed earlier -> reused earlier
    # both still hit while free
    again = Session(ids=[1, 2, 3, 4, 0])
    assert again.attach_prefix(bm) == 4 and again.block_table == [f_block]
    again.drop_kv(bm)
    # reuse everything: the blocks that cache nothing go first, then the hashed ones, least recently freed first;
    # their hashes are forgotten
    order = bm.free_order()
    hashed = [b for b in order if bm.block_hash[b] is not None]
    assert hashed == [s_block, f_block]  # the hit above freed f_block again, after s_block
    taken = [bm.allocate() for _ in range(bm.num_blocks)]
    assert sorted(taken[:-2]) == sorted(set(order) - set(hashed))
    assert taken[-2:] == hashed
    assert bm.match_prefix([1, 2, 3, 4, 0]) == ([], [])
    assert bm.hash_to_block == {}


def test_lru_evicts_oldest_hashed_block_first():
    bm = BlockManager(4, BS)
    a = computed_session(bm, [1, 1, 1, 1, 0])
    b = computed_session(bm, [2, 2, 2, 2, 0])
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    a.drop_kv(bm)
    b.drop_kv(bm)
    # a was freed before b (each tail first). The two tails cache nothing and go first; then a's prefix block is
    # evicted before b's, which survives
    assert bm.free_order() == a_blocks[::-1] + b_blocks[::-1]
    taken = [bm.allocate() for _ in range(3)]
    assert set(taken[:2]) == {a_blocks[1], b_blocks[1]} and taken[2] == a_blocks[0]
    assert Session(ids=[1, 1, 1, 1, 0]).attach_prefix(bm) == 0
    s = Session(ids=[2, 2, 2, 2, 0])
    assert s.attach_prefix(bm) == 4
    assert s.block_table == b_blocks[:1]


def test_prefer_adjacent_block_only_when_unhashed():
    bm = BlockManager(8, BS)
    s = computed_session(bm, list(range(12)))
    assert s.block_table == [0, 1, 2]


def test_truncate_releases_blocks_and_unregisters_partial_block():
    bm = BlockManager(16, BS)
    s = computed_session(bm, list(range(1, 11)))  # 10 tokens: 2 full blocks + 2 tokens
    assert len(s.block_table) == 3 and len(s.block_hashes) == 2
    s.truncate_kv(bm, 6)
    assert s.ids == [1, 2, 3, 4, 5, 6] and s.num_cached == 6
    assert len(s.block_table) == 2 and len(s.block_hashes) == 1
    # the second block is now partial and must not be hit under its old hash
    probe = Session(ids=list(range(1, 11)))
    assert probe.attach_prefix(bm) == 4
    probe.drop_kv(bm)
    s.drop_kv(bm)
    bm.check()
    assert bm.num_free == 16


def test_truncate_at_a_block_boundary_keeps_the_full_blocks():
    bm = BlockManager(16, BS)
    s = computed_session(bm, list(range(1, 11)))  # 10 tokens: 2 full blocks + 2 tokens
    s.truncate_kv(bm, 4)
    assert s.num_cached == 4 and len(s.block_table) == 1 and len(s.block_hashes) == 1
    probe = Session(ids=list(range(1, 11)))
    assert probe.attach_prefix(bm) == 8  # the released full block keeps its hash until reused
    probe.drop_kv(bm)
    s.drop_kv(bm)
    bm.check()
    assert bm.num_free == 16


def test_truncate_into_shared_block_recomputes_instead_of_writing_it():
    bm = BlockManager(16, BS)
    a = computed_session(bm, list(range(1, 10)))
    b = computed_session(bm, list(range(1, 10)))
    shared = a.block_table[1]
    assert bm.ref_count[shared] == 2
    b.truncate_kv(bm, 6)
    assert b.num_cached == 4 and len(b.block_table) == 1
    assert bm.ref_count[shared] == 1
    assert a.num_cached == 9  # the other sequence is untouched
    for s in (a, b):
        s.drop_kv(bm)
    bm.check()
    assert bm.num_free == 16


def _runs(table: list[int]) -> int:
    """How many runs of consecutive block ids the table holds."""
    return 1 + sum(1 for a, b in zip(table, table[1:], strict=False) if b != a + 1)


def test_sessions_taking_turns_each_grow_in_consecutive_blocks():
    """Three sessions share a prefix, then take turns appending a turn each (as calls do). Each session's own
    blocks stay one run, so attention reads its history as two views (prefix, own run) rather than a gather of
    interleaved blocks; handing out the least recently freed block instead interleaves them turn by turn."""
    bm = BlockManager(512, BS)
    prefix = list(range(100, 112))  # 3 full blocks
    sessions = [computed_session(bm, [*prefix, 1000 + i]) for i in range(3)]
    assert all(s.block_table[:3] == sessions[0].block_table[:3] for s in sessions)  # the prefix is stored once
    for turn in range(10):
        for i, s in enumerate(sessions):
            new = [2000 + 100 * i + 10 * turn + k for k in range(7)]
            s.ids.extend(new)
            assert s.ensure_slots(bm, len(s.ids))
            s.commit(bm, len(new))
    assert _runs(sessions[0].block_table) == 1  # it computed the prefix: its own blocks follow it
    assert [_runs(s.block_table[3:]) for s in sessions[1:]] == [1, 1]
    bm.check()
    drop_all_and_check_no_leak(bm, sessions)


def test_a_new_run_starts_mid_gap_and_never_evicts_a_cached_block_while_a_blank_one_is_free():
    bm = BlockManager(16, BS)
    cached = computed_session(bm, list(range(8)))  # 2 full blocks at the pool's start
    cached_blocks = list(cached.block_table)
    cached.drop_kv(bm)  # free, still hashed
    s = Session(ids=[50, 51, 52, 53, 54])
    assert s.ensure_slots(bm, 5)
    assert s.block_table == [9, 10]  # the middle of blank blocks 2..15: the run before it keeps room to grow
    assert Session(ids=list(range(8)) + [9]).attach_prefix(bm) == 8  # the cached blocks were left alone
    bm.check()
    assert set(cached_blocks).isdisjoint(s.block_table)
