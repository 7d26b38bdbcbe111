"""`voicepipe bench turns`: every end-of-turn policy over one labelled set, in one run.

The set (`voicepipe.bench.turn_corpus`) holds complete utterances and utterances with a 500-1200 ms pause after a
plainly unfinished fragment. `voicepipe.bench.turn_evidence` plays each one as a real call and records, at each of
the VAD's speech ends, the evidence the call got and when; here each policy is asked after every VAD window, as a
call's `TurnDetector` asks it, with the evidence known by then. Figures:
- wait: on complete utterances, from the true end of speech to the decision (`<policy>_wait_p50_ms`, p95);
- false cut-off: paused utterances ended before their continuation began (`<policy>_false_cutoff_rate`);
- `wait_ratio`: hybrid's wait p50 over silence's (the old rule, the baseline);
- `decision_p95_ms`: what one text decision costs: what the end probe adds to the early reply's prefill (one more
  row of the output projection, a softmax); `acoustic_decision_p95_ms`: one Smart Turn inference;
- when the evidence lands: `text_ready_*` and `acoustic_ready_*`, from the VAD's report of the speech end.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voicepipe.bench.turn_evidence import RATE, Evidence, collect_evidence, load_recordings, save_recordings
from voicepipe.config import Settings, TurnSettings
from voicepipe.cpu_load import cpu_load as spinning
from voicepipe.turns.policy import POLICIES, TurnEvidence, TurnPolicy, marked_end
from voicepipe.vad.silero import WINDOW


@dataclass(frozen=True)
class Outcome:
    decided_at: int | None  # the sample position of the "end" decision (None: never, within the audio)
    wait_ms: float | None  # complete utterances: from the true end of speech to the decision
    cut_off: bool  # ended before the caller had finished


def replay(policy: TurnPolicy, ev: Evidence, evidence_wait_ms: float | None = None) -> Outcome:
    """Where `policy` ends the turn, and when, as a call decides (voicepipe/pipeline/turn_taking.py): at each pause
    the decision is taken at the first VAD window whose silence reaches the wait that the pause's evidence asks for,
    before the caller's audio past that window is judged, however late the evidence lands; the caller waits for
    that window and for the evidence, whichever comes later. Evidence that lands more than `evidence_wait_ms` after
    the VAD's report of the speech end (default: the policy's setting) counts as missing: the decision then takes
    the wait without it, and not before that bound."""
    bound = policy.settings.evidence_wait_ms if evidence_wait_ms is None else evidence_wait_ms
    for pause in ev.pauses:
        stop = ev.processed if pause.resumed is None else pause.resumed
        late = pause.at + int(bound * RATE / 1000)  # where the bound falls, in the utterance's samples
        text = _in_time(pause.text_prob, pause.text_ready, late)
        marked = marked_end(pause.text) and text is not None
        awaited = [pause.text_ready] if policy.uses_text else []
        sound = None
        if policy.needs_sound(text, marked):
            sound = _in_time(pause.acoustic_prob, pause.acoustic_ready, late)
            awaited.append(pause.acoustic_ready)
        decision = policy.decide(TurnEvidence(0.0, text, sound, marked))
        due = pause.end + int(-(-decision.wait_ms * RATE // 1000))  # the silence is long enough
        pos = max(pause.at, pause.at + -(-(due - pause.at) // WINDOW) * WINDOW)
        if pos < stop:
            return _outcome(ev, pos, max([pos, *(late if r is None else min(r, late) for r in awaited)]))
    return Outcome(None, None, False)


def _in_time(value: float | None, ready: int | None, late: int) -> float | None:
    return value if ready is not None and ready <= late else None


def _outcome(ev: Evidence, pos: int, answered: int) -> Outcome:
    """Decided at `pos`; the caller's wait runs to `answered` (the decision, or the evidence it waited for)."""
    finished = ev.speech_end if ev.label == "complete" else ev.pause_end
    cut_off = pos < finished
    wait = (answered - ev.speech_end) * 1000 / RATE if ev.label == "complete" and not cut_off else None
    return Outcome(pos, wait, cut_off)


def score(policy: TurnPolicy, evidence: list[Evidence]) -> dict[str, float | int | None]:
    """One policy's figures over the set."""
    outcomes = [(ev, replay(policy, ev)) for ev in evidence]
    complete = [o for ev, o in outcomes if ev.label == "complete"]
    paused = [o for ev, o in outcomes if ev.label == "paused"]
    # a complete utterance never ended within its 3 s of silence waited at least that long
    waits = [o.wait_ms if o.decided_at is not None else _tail_ms(ev) for ev, o in outcomes
             if ev.label == "complete" and not o.cut_off]
    return {"wait_p50_ms": _pct(waits, 50), "wait_p95_ms": _pct(waits, 95),
            "false_cutoff_rate": _rate(sum(o.cut_off for o in paused), len(paused)),
            "complete_cut_rate": _rate(sum(o.cut_off for o in complete), len(complete)),
            "undecided": sum(o.decided_at is None for _, o in outcomes)}


def _tail_ms(ev: Evidence) -> float:
    return (ev.processed - ev.speech_end) * 1000 / RATE


def flat_report(evidence: list[Evidence], settings: Settings, policies=POLICIES) -> dict[str, object]:
    """The flat keys of the issue: `<policy>_wait_p50_ms`, `<policy>_false_cutoff_rate`, ..., `wait_ratio`."""
    report: dict[str, object] = {}
    for name in policies:
        figures = score(TurnPolicy(name, settings.turn, settings.vad.end_of_turn_silence_ms), evidence)
        report.update({f"{name}_{key}": value for key, value in figures.items()})
    silence, hybrid = report.get("silence_wait_p50_ms"), report.get("hybrid_wait_p50_ms")
    report["wait_ratio"] = round(hybrid / silence, 3) if silence and hybrid is not None else None
    return report


def calibrate(evidence: list[Evidence], settings: TurnSettings, max_cutoff: float = 0.05) -> dict[str, object]:
    """For `text` and `hybrid`: the thresholds and waits that give the shortest wait p50, on all utterances and on
    the conversational ones alike, with false cut-off rates (paused and complete utterances, all of them and the
    conversational ones) of at most `max_cutoff`, searched over a grid (short and long waits as configured); `best`
    names the policy with the shorter wait. The defaults in `TurnSettings` come from this. Hybrid keeps the text's
    threshold for words the STT ended with a sentence mark (`text_complete_marked`)."""
    text_grid = [0.003, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    sound_grid = [0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95, 1.01]  # 1.01: the sound never says complete
    words = [{"text_complete": hi, "text_incomplete": lo} for lo in text_grid for hi in text_grid if hi >= lo]
    sound = [{"acoustic_complete": hi, "acoustic_incomplete": lo, "acoustic_alone": alone}
             for alone in (False, True) for lo in sound_grid[:-1] for hi in sound_grid if hi >= lo]
    found: dict[str, object] = {}
    marked = [{**w, "text_complete_marked": m} for w in words for m in text_grid if m >= w["text_incomplete"]]
    found_text = _best("text", marked, evidence, settings, max_cutoff)
    if found_text is not None:
        found["text"] = found_text
    mark = {"text_complete_marked": found_text["text_complete_marked"]} if found_text else {}
    both = [{**w, "text_complete_marked": w["text_complete"], **mark, **a} for w in words for a in sound]
    found_hybrid = _best("hybrid", both, evidence, settings, max_cutoff)
    if found_hybrid is not None:
        found["hybrid"] = found_hybrid
    if found:
        found["best"] = min((n for n in ("text", "hybrid") if n in found), key=lambda n: _objective(found[n]))
    return found


def _best(name: str, points: list[dict], evidence: list[Evidence], settings: TurnSettings,
          max_cutoff: float) -> dict[str, object] | None:
    later = [ev for ev in evidence if ev.turn > 1]
    best: tuple[tuple, dict] | None = None
    for point in ({**p, "middle_wait_ms": middle} for p in points for middle in (700, 1000, 1300)):
        policy = TurnPolicy(name, settings.model_copy(update=point), 0)
        figures = score(policy, evidence)
        conversational = score(policy, later) if later else figures
        if max(figures["false_cutoff_rate"], figures["complete_cut_rate"], conversational["false_cutoff_rate"],
               conversational["complete_cut_rate"]) > max_cutoff:
            continue
        figures = {**figures, **{f"conversational_{k}": v for k, v in conversational.items()}}
        key = _objective(figures)
        if best is None or key < best[0]:
            best = (key, {**point, **figures})
    return None if best is None else best[1]


def _objective(figures: dict) -> tuple:
    """Shorter waits first (the longer p50 of all utterances and of the conversational ones), then fewer cut-offs."""
    return (max(figures["wait_p50_ms"], figures["conversational_wait_p50_ms"]), figures["wait_p95_ms"],
            figures["false_cutoff_rate"])


PER_CALL = 4  # utterances a call plays in turn: the first after the greeting, the others with a conversation's history


def run_turns_bench(settings: Settings, cache_dir, progress: Callable[[str], None] = print,
                    sweep: bool = False, evidence_file: Path | None = None, cpu_load: int = 0) -> dict[str, object]:
    """The whole bench. The labelled set is recorded as calls on a quiet machine and, with `cpu_load`, again beside
    that many spinning processes, in one run. With `evidence_file`: an existing file holds the recordings to replay
    (no models, no costs measured); else the recordings are written there."""
    started = time.perf_counter()
    if evidence_file is not None and evidence_file.is_file():
        progress(f"replaying the evidence recorded in {evidence_file}")
        recordings = load_recordings(evidence_file)
        report: dict[str, object] = {"evidence": str(evidence_file)}
    else:
        recordings, report = _record(settings, cache_dir, progress, cpu_load)
        if evidence_file is not None:
            save_recordings(recordings, evidence_file)
    quiet = recordings["quiet"]
    report.update(flat_report(quiet, settings))
    report.update(default_policy_report(recordings, settings))
    report.update(_about(quiet, settings))
    if sweep:
        progress("calibrating the thresholds")
        report["calibration"] = calibrate(quiet, settings.turn)
    report["pauses"] = [_pause_row(ev, p) for ev in quiet for p in ev.pauses]
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def default_policy_report(recordings: dict[str, list[Evidence]], settings: Settings) -> dict[str, object]:
    """The configured policy on conversational turns (an utterance scored with its call's history) and, where the run
    recorded one, on the busy machine against the quiet one: the decisions should be the same (the evidence is
    the same), the waits a little longer (the evidence lands later)."""
    policy = TurnPolicy(settings.turn.policy, settings.turn, settings.vad.end_of_turn_silence_ms)
    quiet = recordings["quiet"]
    first = score(policy, [ev for ev in quiet if ev.turn == 1])
    later = score(policy, [ev for ev in quiet if ev.turn > 1])
    report: dict[str, object] = {
        "policy": policy.name,
        "first_turn_false_cutoff_rate": first["false_cutoff_rate"], "first_turn_wait_p50_ms": first["wait_p50_ms"],
        "conversational_false_cutoff_rate": later["false_cutoff_rate"],
        "conversational_wait_p50_ms": later["wait_p50_ms"], "conversational_wait_p95_ms": later["wait_p95_ms"],
        "conversational_utterances": sum(ev.turn > 1 for ev in quiet),
    }
    loaded = recordings.get("loaded")
    if loaded:
        calm, busy = score(policy, quiet), score(policy, loaded)
        report.update({
            "false_cutoff_rate_quiet": calm["false_cutoff_rate"], "false_cutoff_rate_loaded": busy["false_cutoff_rate"],
            "wait_p50_quiet_ms": calm["wait_p50_ms"], "wait_p50_loaded_ms": busy["wait_p50_ms"],
            "wait_p50_loaded_over_quiet": (round(busy["wait_p50_ms"] / calm["wait_p50_ms"], 3)
                                           if calm["wait_p50_ms"] and busy["wait_p50_ms"] is not None else None),
            "same_decisions_rate": _same_decisions(policy, quiet, loaded),
            "same_evidence_rate": _same_evidence(quiet, loaded),
        })
    return report


def _same_decisions(policy: TurnPolicy, quiet: list[Evidence], loaded: list[Evidence]) -> float | None:
    """The share of utterances the policy ends at the same sample in both recordings."""
    pairs = list(zip(quiet, loaded, strict=True))
    return _rate(sum(replay(policy, a).decided_at == replay(policy, b).decided_at for a, b in pairs), len(pairs))


def _same_evidence(quiet: list[Evidence], loaded: list[Evidence]) -> float | None:
    """The share of utterances whose pauses heard the same words with the same probabilities in both recordings."""
    def seen(ev: Evidence) -> list[tuple]:
        return [(p.end, p.text, _rounded(p.text_prob), _rounded(p.acoustic_prob)) for p in ev.pauses]

    pairs = list(zip(quiet, loaded, strict=True))
    return _rate(sum(seen(a) == seen(b) for a, b in pairs), len(pairs))


def _rounded(prob: float | None) -> float | None:
    """A probability as a decision record keeps it: the engine's last bits move with how its steps were batched."""
    return None if prob is None else round(prob, 4)


def _record(settings: Settings, cache_dir: Path, progress: Callable[[str], None], cpu_load: int):
    """Play the labelled set as calls, quiet and then (with `cpu_load`) beside spinning processes, and record the
    evidence; measure what one decision's evidence costs."""
    from voicepipe.bench.turn_corpus import build_turn_corpus
    from voicepipe.pipeline.resources import call_resources
    from voicepipe.runtime import Runtime

    progress("loading the models")
    # every policy is scored, so Smart Turn loads whatever the configured policy needs ("on": or a clear error)
    runtime = Runtime(settings.model_copy(update={"turn": settings.turn.model_copy(update={"acoustic": "on"})}))
    runtime.load()
    recordings: dict[str, list[Evidence]] = {}
    try:
        if runtime.turn is None:
            raise RuntimeError("bench turns needs the acoustic model: run `voicepipe models fetch smart-turn-v3.2`.")
        progress("building the labelled set (cached after the first run)")
        items = conversation_order(build_turn_corpus(runtime.synthesizer, cache_dir,
                                                     _every_tenth(progress, "synthesized")))
        runs = [("quiet", 0)] + ([("loaded", cpu_load)] if cpu_load else [])
        for name, load in runs:
            progress(f"{name}: playing {len(items)} utterances as calls of {PER_CALL} turns, in real time, "
                     f"recording the evidence at every pause" + (f", beside {load} spinning processes" if load else ""))
            with spinning(load):
                recordings[name] = collect_evidence(items, call_resources(runtime), settings,
                                                    _every_tenth(progress, "utterances"), per_call=PER_CALL)
        progress("the end probe's and Smart Turn's cost")
        probe_ms = _probe_cost(runtime.engine)
        acoustic_ms = _acoustic_cost(runtime.turn, items)
    finally:
        runtime.close()
    pauses = [p for ev in recordings["quiet"] for p in ev.pauses]
    return recordings, {
        "cpu_load": cpu_load,
        "decision_p95_ms": _pct(probe_ms, 95),
        "decision_p50_ms": _pct(probe_ms, 50),
        "acoustic_decision_p95_ms": _pct(acoustic_ms, 95),
        "text_ready_p50_ms": _ready(pauses, "text", 50),
        "text_ready_p95_ms": _ready(pauses, "text", 95),
        "acoustic_ready_p50_ms": _ready(pauses, "acoustic", 50),
        "vad_report_p50_ms": _pct([(p.at - p.end) * 1000 / RATE for p in pauses], 50),
        **{f"late_starts_{name}": sum(ev.late_start for ev in evidence) for name, evidence in recordings.items()},
        **({"text_ready_loaded_p95_ms": _ready([p for ev in recordings["loaded"] for p in ev.pauses], "text", 95),
            "text_ready_loaded_max_ms": _ready([p for ev in recordings["loaded"] for p in ev.pauses], "text", 100)}
           if "loaded" in recordings else {}),
    }


def conversation_order(items: list) -> list:
    """The labelled set in a fixed mixed order (complete and paused, voices and rates alternating), so that each
    call's turns are a mix and every utterance but each call's first is scored with a conversation before it."""
    return sorted(items, key=lambda item: hashlib.sha256(item.name.encode()).hexdigest())


def _about(evidence: list[Evidence], settings: Settings) -> dict[str, object]:
    return {
        "utterances": {"complete": sum(ev.label == "complete" for ev in evidence),
                       "paused": sum(ev.label == "paused" for ev in evidence),
                       "voices": sorted({ev.voice for ev in evidence})},
        "settings": {"turn": settings.turn.model_dump(), "end_of_turn_silence_ms": settings.vad.end_of_turn_silence_ms,
                     "vad_min_silence_ms": settings.vad.min_silence_ms},
        "targets": {"hybrid_false_cutoff_rate": 0.05, "hybrid_wait_p50_ms": 250, "wait_ratio": 0.4,
                    "decision_p95_ms": 30},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg": [round(x, 2) for x in os.getloadavg()]},
    }


def _probe_cost(engine, repeats: int = 50) -> list[float]:
    """What the end probe adds to the early reply's prefill, which runs anyway (ms): the output projection of one
    more row, and the softmax and sum over the end tokens. (When the words' K/V were prefilled while the caller
    spoke, the tokens after the probe's row are computed again too: a few tokens of that prefill.)"""
    import torch

    runner = engine.runner
    # the output projection the engine runs: its decoder's (in the chosen weight format), else the model's own
    head = runner.decoder.lm_head if runner.decoder is not None else runner.model.get_output_embeddings()
    width = runner.model.get_output_embeddings().weight.shape[1]
    hidden = torch.randn(2, width, dtype=runner.dtype, device=runner.device)
    out = []
    with torch.inference_mode():
        for _ in range(repeats):
            began = time.perf_counter()
            head(hidden[:1])
            one = time.perf_counter()
            logits = head(hidden)
            torch.softmax(logits[1:].float(), dim=-1)[:, engine.end_ids].sum(dim=-1).tolist()
            out.append(((time.perf_counter() - one) - (one - began)) * 1000)
    return out


def _acoustic_cost(acoustic, items) -> list[float]:
    """Smart Turn's inference time on each utterance's audio (ms), on an otherwise idle process."""
    out = []
    for item in items:
        began = time.perf_counter()
        acoustic.predict(item.audio[:item.speech_end])
        out.append((time.perf_counter() - began) * 1000)
    return out


def _ready(pauses, kind: str, q: float) -> float | None:
    """The q-th percentile of the time from the VAD's report of a speech end to `kind`'s evidence (ms)."""
    return _pct([(getattr(p, f"{kind}_ready") - p.at) * 1000 / RATE for p in pauses
                 if getattr(p, f"{kind}_ready") is not None], q)


def _pause_row(ev: Evidence, p) -> dict[str, object]:
    def since_report(ready: int | None) -> float | None:
        return None if ready is None else round((ready - p.at) * 1000 / RATE, 1)

    return {"name": ev.name, "label": ev.label, "voice": ev.voice, "text": p.text, "text_prob": p.text_prob,
            "acoustic_prob": p.acoustic_prob, "silence_at_report_ms": round((p.at - p.end) * 1000 / RATE, 1),
            "text_ready_ms": since_report(p.text_ready), "acoustic_ready_ms": since_report(p.acoustic_ready),
            "final": p.resumed is None}


def _every_tenth(progress: Callable[[str], None], what: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if done == total or done % 10 == 0:
            progress(f"  {done}/{total} {what}")
    return report


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _rate(n: int, total: int) -> float | None:
    return round(n / total, 4) if total else None
