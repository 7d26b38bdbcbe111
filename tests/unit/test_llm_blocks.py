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
    for s in sessions:
        s.drop_kv(bm)
    assert bm.num_free == bm.num_blocks
    bm.check()


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
    # reuse everything: the least recently freed blocks go first, and their hashes are forgotten
    order = bm.free_order()
    taken = [bm.allocate() for _ in range(bm.num_blocks)]
    assert taken == order
    assert bm.match_prefix([1, 2, 3, 4, 0]) == ([], [])
    assert bm.hash_to_block == {}


def test_lru_evicts_oldest_hashed_block_first():
    bm = BlockManager(4, BS)
    a = computed_session(bm, [1, 1, 1, 1, 0])
    b = computed_session(bm, [2, 2, 2, 2, 0])
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    a.drop_kv(bm)
    b.drop_kv(bm)
    # a was freed before b (each tail first), so a's blocks are reused first and b's cached prefix survives
    assert bm.free_order() == a_blocks[::-1] + b_blocks[::-1]
    taken = {bm.allocate(), bm.allocate()}
    assert taken == set(a_blocks)
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
