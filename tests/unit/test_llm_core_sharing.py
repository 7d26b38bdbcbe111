"""The engine's thread count after a stall of the fused kernels (`CoreSharing`), on a fake clock and stall count."""

from __future__ import annotations

from voicepipe.llm.core_sharing import LONGEST_ALONE_S, SHORTEST_ALONE_S, CoreSharing


class Kernels:
    def __init__(self) -> None:
        self.stalls, self.now, self.set_to = 0, 100.0, []

    def sharing(self, threads: int = 2) -> CoreSharing:
        return CoreSharing(lambda: self.stalls, self.set_to.append, threads, clock=lambda: self.now)

    def step(self, sharing: CoreSharing, after_s: float = 0.01, stalled: bool = False) -> None:
        self.now += after_s
        self.stalls += stalled
        sharing.after_step()


def test_steps_without_stalls_keep_every_thread() -> None:
    kernels = Kernels()
    sharing = kernels.sharing()
    for _ in range(100):
        kernels.step(sharing)
    assert kernels.set_to == [] and not sharing.alone


def test_a_stall_runs_the_engine_on_one_thread_for_a_while_then_on_all_again() -> None:
    kernels = Kernels()
    sharing = kernels.sharing()
    kernels.step(sharing, stalled=True)
    assert kernels.set_to == [1] and sharing.alone
    kernels.step(sharing, after_s=SHORTEST_ALONE_S / 2)
    assert kernels.set_to == [1]
    kernels.step(sharing, after_s=SHORTEST_ALONE_S / 2 + 0.001)
    assert kernels.set_to == [1, 2] and not sharing.alone


def test_stalls_right_after_each_try_lengthen_the_while_up_to_a_second() -> None:
    """A core taken for good (a busy machine): each try on all threads stalls at once, so tries get rarer."""
    kernels = Kernels()
    sharing = kernels.sharing()
    whiles = []
    for _ in range(8):
        kernels.step(sharing, stalled=True)
        began = kernels.now
        while sharing.alone:
            kernels.step(sharing, after_s=0.001)
        whiles.append(round(kernels.now - began, 2))
    assert whiles == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert LONGEST_ALONE_S == 1.0


def test_a_lone_stall_long_after_the_last_try_costs_the_shortest_while() -> None:
    """The call's own STT or TTS took the core for a moment: the next stall, seconds later, starts over."""
    kernels = Kernels()
    sharing = kernels.sharing()
    for _ in range(3):
        kernels.step(sharing, stalled=True)
        while sharing.alone:
            kernels.step(sharing, after_s=0.005)
    assert sharing.alone_s == 4 * SHORTEST_ALONE_S
    kernels.step(sharing, after_s=3.0, stalled=True)
    assert sharing.alone_s == SHORTEST_ALONE_S and sharing.alone


def test_one_thread_has_nothing_to_fall_back_to() -> None:
    kernels = Kernels()
    sharing = kernels.sharing(threads=1)
    kernels.step(sharing, stalled=True)
    assert kernels.set_to == [] and not sharing.alone


def test_stalls_counted_while_alone_do_not_restart_the_while() -> None:
    """A stall the kernels counted during the step that went alone is seen once."""
    kernels = Kernels()
    sharing = kernels.sharing()
    kernels.step(sharing, stalled=True)
    kernels.step(sharing, after_s=0.03, stalled=True)
    kernels.step(sharing, after_s=0.03)
    assert kernels.set_to == [1, 2]
