"""The end probe: P(the user message ends where its words end), computed in the reply's own prefill.

Real SmolLM2-135M weights. The probe must tell a finished sentence from a fragment, must not change the reply or
the session (greedy output, ids and history are those of the same turn without it), and must still be computed
when the words were already prefilled while the caller spoke (their K/V cached: the probe row is recomputed).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.llm_helpers import start_engine

pytestmark = pytest.mark.e2e

SYSTEM = "You are a friendly voice assistant on a phone call."
COMPLETE = ["I want to book a table for four people tonight.", "What time do you open on Sunday?",
            "Is the museum open on Sunday?", "Yes, that's right."]
FRAGMENTS = ["I want to book a table for.", "What time do you.", "Can you tell me how to", "My account number is."]


@pytest.fixture(scope="module")
def engine(engine_model):
    engine = start_engine(engine_model)
    yield engine
    engine.stop()


async def reply(engine, session, text: str, prefill_words: bool = False, **kw):
    if prefill_words:
        engine.prefill_user_words(session, text.rstrip(".?"))
        for _ in range(400):  # the idle prefill of those words
            if not session.pending:
                break
            await asyncio.sleep(0.01)
        assert not session.pending
    gen = engine.generate(session, [{"role": "user", "content": text}], max_tokens=8, **kw)
    ids = [t async for piece in gen for t in piece.token_ids]
    return ids, await gen.end_prob, gen.stats


def test_the_probe_tells_finished_sentences_from_fragments(engine) -> None:
    async def main():
        probs = {}
        for text in COMPLETE + FRAGMENTS:
            session = engine.open_session(SYSTEM)
            _, probs[text], stats = await reply(engine, session, text, end_probe=True)
            assert stats.end_prob == probs[text]
            engine.close_session(session)
        return probs

    probs = asyncio.run(main())
    assert min(probs[t] for t in COMPLETE) > 0.1 > 0.01 > max(probs[t] for t in FRAGMENTS), probs


def test_the_probe_leaves_the_reply_and_the_session_as_they_were(engine) -> None:
    async def main():
        out = []
        for probe in (False, True):
            session = engine.open_session(SYSTEM)
            await reply(engine, session, "Hello.")  # a first turn, so the next user turn's words can be prefilled
            ids, prob, _ = await reply(engine, session, "I want to book a table for four people tonight.",
                                       prefill_words=True, end_probe=probe)
            out.append((ids, prob, list(session.ids), engine.history(session)))
            engine.close_session(session)
        return out

    (ids, prob, session_ids, history), (ids_p, prob_p, session_ids_p, history_p) = asyncio.run(main())
    assert prob is None and prob_p > 0.1  # computed although its row's K/V had been prefilled while speaking
    assert ids_p == ids and session_ids_p == session_ids and history_p == history


def test_no_words_no_probe(engine) -> None:
    async def main():
        session = engine.open_session(SYSTEM)
        _, prob, stats = await reply(engine, session, "...", end_probe=True)
        engine.close_session(session)
        return prob, stats.end_prob

    assert asyncio.run(main()) == (None, None)
