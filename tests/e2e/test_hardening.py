"""Hardening with the real models, on one in-process server (the soak's settings, `voicepipe.bench.soak`):

1. the churn soak, 10 calls in waves of 4 over every call link, with barge-ins, abrupt hang-ups and bad frames:
   every resource back to its value after the warm-up wave, RSS within its bound, no healthy call losing audio or
   a turn (`voicepipe bench soak --calls 50` is the long run);
2. a fault inside the STT, the TTS and the LLM engine's worker, each for one call, while a fourth call runs: each
   faulted call's turn fails with a logged error, the other calls and the workers go on;
3. schemathesis over the HTTP surface from its OpenAPI description: no 5xx, and every response as described.

Where a fault is injected, a wrapper around the real worker code raises for the faulted call's work only: the
STT's decoder (for that call's stream), the TTS stream's delivery of a clause (for that call's reply) and the
engine's model forward (for that call's session). They stand in for what cannot be produced on demand (a model or
device error on one call's data); everything else is the real pipeline.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from voicepipe.bench.call import make_utterances
from voicepipe.bench.soak import KINDS, TRANSPORTS, call_url, soak, soak_settings
from voicepipe.caller import scripted_call
from voicepipe.caller.turns import converse
from voicepipe.server import serve_in_thread
from voicepipe.tts.synthesizer import SpeechStream

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(settings, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hardening")
    utterances = make_utterances(2, tmp)
    with serve_in_thread(soak_settings(settings, tmp)) as (base, app):
        yield base, app, utterances


def test_churn_soak_returns_every_resource_and_loses_no_healthy_call(server) -> None:
    base, app, utterances = server
    lines: list[str] = []
    report = soak(base, app, utterances, calls=10, wave=4, progress=lines.append)
    print("\n".join(lines))
    assert set(report["calls_by_transport"]) == set(TRANSPORTS) and all(report["calls_by_transport"].values())
    assert all(report["calls_by_kind"][kind] for kind in KINDS)
    assert not report["bound_problems"], report["bound_problems"]
    assert not report["unhealthy_calls"], report["unhealthy_calls"]
    assert report["after.live_calls"] == report["after.llm_sessions"] == report["after.kv_blocks_used"] == 0
    assert report["passed"]


def test_the_loaded_models_are_out_of_the_collectors_sight(server) -> None:
    """A full collection walked every object of the models (~190 ms for 400k objects, holding the GIL): the event
    loop, and every call's audio with it, stalled as long once in a while."""
    _, app, _ = server
    runtime = app.state.runtime
    assert gc.get_freeze_count() > 100_000
    assert not any(obj is runtime.engine or obj is runtime.transcriber for obj in gc.get_objects())


# -- faults inside the workers ------------------------------------------------------------------------------------


class Faults:
    """Arms one fault per worker, each for one call (by call id), through wrappers around the real code."""

    def __init__(self, app, monkeypatch) -> None:
        runtime = app.state.runtime
        self.app = app
        self.stt_contexts: list[list[int]] = []  # the faulted call's STT stream's context (by identity)
        self.tts_streams: weakref.WeakSet = weakref.WeakSet()
        self.llm_sessions: list = []
        decoder, runner = runtime.transcriber.decoder, runtime.engine.runner
        real_decode, real_forward, real_deliver = decoder.decode_batch, runner.forward, SpeechStream._deliver

        def decode_batch(audios, contexts, prefixes):
            if any(c is faulted for c in contexts for faulted in self.stt_contexts):
                raise RuntimeError("injected STT fault")
            return real_decode(audios, contexts, prefixes)

        def forward(items):
            if any(item.session is faulted for item in items for faulted in self.llm_sessions):
                raise RuntimeError("injected LLM fault")
            return real_forward(items)

        def deliver(stream, chunk, clause):
            if stream in self.tts_streams:
                raise RuntimeError("injected TTS fault")
            return real_deliver(stream, chunk, clause)

        monkeypatch.setattr(decoder, "decode_batch", decode_batch)
        monkeypatch.setattr(runner, "forward", forward)
        monkeypatch.setattr(SpeechStream, "_deliver", deliver)

    async def arm(self, call_id: str, worker: str) -> None:
        """Once the call is live (its greeting plays first): fault its STT stream, its replies' speech or its LLM
        session from now on."""
        calls = self.app.state.calls.active
        while call_id not in calls or calls[call_id].stt is None:  # listed, then started: its STT and LLM session
            await asyncio.sleep(0.01)
        call = calls[call_id]
        if worker == "stt":
            call.stt.context = list(call.stt.context)  # its own object, so that only this stream's decodes fail
            self.stt_contexts.append(call.stt.context)
        elif worker == "llm":
            self.llm_sessions.append(call.session)
        else:
            real_open = call._open_speech

            def open_speech(turn):
                stream = real_open(turn)
                if turn >= 1:  # the replies, not the greeting
                    self.tts_streams.add(stream)
                return stream

            call._open_speech = open_speech


def test_a_fault_in_each_worker_fails_one_call_turn_and_the_rest_goes_on(server, monkeypatch, caplog) -> None:
    base, app, utterances = server
    faults = Faults(app, monkeypatch)
    faulted = {"stt": ("fault-stt", "twilio"), "tts": ("fault-tts", "native"), "llm": ("fault-llm", "telnyx")}

    async def talk(call_id: str, transport: str, utts, reply_timeout_s: float):
        async def turns(line, server_state) -> None:
            await converse(line, utts, server_state, greeting_wait_s=30, reply_timeout_s=reply_timeout_s,
                           quiet_s=0.6, barge_in_after_ms=None)

        return await scripted_call(call_url(base, app, transport), transport, turns, call_id=call_id,
                                   record_url=base)

    async def faulted_calls_and(call_id: str, transport: str):
        """The faulted calls (one utterance each: a short wait for the reply that cannot come) and one more call
        at once, with all its utterances; the faults are armed as their calls go live."""
        arming = [faults.arm(call, worker) for worker, (call, _) in faulted.items()]
        calls = [talk(call, via, utterances[:1], 20.0) for call, via in faulted.values()]
        results = await asyncio.gather(*arming, *calls, talk(call_id, transport, utterances, 60.0))
        return {r.call_id: r for r in results[len(arming):]}

    with caplog.at_level(logging.ERROR):
        results = asyncio.run(faulted_calls_and("healthy", "vonage"))
    for worker, (call_id, _) in faulted.items():
        [turn] = results[call_id].record["turns"]
        assert f"injected {worker.upper()} fault" in (turn.get("error") or ""), (worker, turn)
    healthy = results["healthy"]
    assert len(healthy.turns) == 2 and all(t.first_audio is not None for t in healthy.turns)
    assert [bool(t["user_text"]) and not t.get("error") for t in healthy.record["turns"]] == [True, True]
    for line in ("STT worker job failed", "TTS synthesis failed", "LLM step failed", "turn 1 failed"):
        assert line in caplog.text, line
    after = asyncio.run(talk("after-the-faults", "plivo", utterances, 60.0))  # every worker serves on
    assert all(t.first_audio is not None for t in after.turns)
    assert [not t.get("error") for t in after.record["turns"]] == [True, True]


# -- schemathesis over the HTTP surface -------------------------------------------------------------------------

REPLY_CAP = 8  # tokens
EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 10}  # per route


def cap_reply(case) -> None:
    """Replies of at most `REPLY_CAP` tokens: each token costs tens of ms on a CPU, and neither property under test
    depends on a reply's length. Larger values the engine would accept become `REPLY_CAP`; values past any
    context (and every other field) go as generated."""
    body = case.body
    if not (case.path.startswith("/v1/") and isinstance(body, dict)):
        return
    limits = [k for k in ("max_tokens", "max_completion_tokens") if k in body and body[k] is not None]
    if not limits:
        body["max_tokens"] = REPLY_CAP
    for key in limits:
        value = body[key]
        if isinstance(value, int) and not isinstance(value, bool) and REPLY_CAP < value <= 8192:
            body[key] = REPLY_CAP


def fuzz_operation(operation, mode: GenerationMode) -> str | None:
    """Hypothesis over one route's generated requests; the first failure schemathesis reports, or None."""
    try:
        strategy = operation.as_strategy(generation_mode=mode)
    except Exception as exc:  # no schema-invalid request exists for this route
        return None if mode is GenerationMode.NEGATIVE else f"no strategy: {exc}"

    @given(strategy)
    @settings(max_examples=EXAMPLES[mode], deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate])
    def check(case) -> None:
        cap_reply(case)
        case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=120)

    try:
        check()
    except Unsatisfiable:  # a route with nothing to get wrong (no parameters, no body) has no invalid request
        return None if mode is GenerationMode.NEGATIVE else "no request could be generated"
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis reports its findings as an exception group
        return str(exc)[:2000]
    return None


def test_the_http_api_gives_no_5xx_and_answers_as_described(server) -> None:
    """schemathesis's checks on every route of /openapi.json, with schema-valid and schema-invalid requests: no 5xx,
    and status codes, content types, headers and bodies as described. All its checks but
    `positive_data_acceptance`: some inputs are formats a JSON schema cannot state (an SDP offer, a UTC time in the
    dashboard's filter), and a 400 for a bad one is right. (Its pytest plugin's lazy loading does not run under
    pytest 9, so the routes are driven here with hypothesis directly.)"""
    base, _, _ = server
    operations = [result.ok() for result in schemathesis.openapi.from_url(f"{base}/openapi.json")
                  .get_all_operations()]
    assert len(operations) >= 15
    failures = {f"{op.label} ({mode.value})": failure for op in operations for mode in EXAMPLES
                if (failure := fuzz_operation(op, mode)) is not None}
    assert not failures, "\n\n".join(f"{where}: {failure}" for where, failure in failures.items())
