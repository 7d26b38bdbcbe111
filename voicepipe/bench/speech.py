"""`voicepipe bench speech`: streaming STT final latency vs. a whole-utterance baseline, TTS time to first
audio, real-time factors, and the VAD's cost per 20 ms frame. All figures come from one run on this machine.

STT: Piper speaks utterances of 1-6 s (no commas, so the VAD sees one segment each). Each is fed in 20 ms
chunks at real-time pace through the VAD and a `TranscriptStream`; when the VAD emits speech_end, the turn
is finished with that end sample. `final_latency_ms` runs from that speech_end event to the final
transcript. A second pass finishes the turn at the VAD's end_of_turn instead, as the call pipeline does
(`final_latency_after_end_of_turn_ms`). The baseline is the non-streaming way: at the same point,
transcribe the whole utterance at once (`baseline_final_latency_ms`, the same short-window decoder) and with
faster-whisper's stock `transcribe` (`stock_baseline_final_latency_ms`, 30 s windows).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import numpy as np

from voicepipe.audio import resample
from voicepipe.config import Settings

RATE = 16000
CHUNK = RATE // 50

# 1-6 s when spoken by the default voice; no commas (a comma pause could end the VAD segment early).
STT_SENTENCES = [
    "Yes please.",
    "Cancel my order.",
    "What time do you open tomorrow?",
    "I would like to book a table for two.",
    "Can you tell me the weather in Boston tomorrow morning?",
    "My daughter has three cats and two small dogs at home.",
    "Please send the report to my email address before Friday afternoon.",
    "I need to speak with someone about the charges on my last phone bill.",
    "The train to the airport leaves from platform three in about ten minutes from now.",
    "Could you move my dentist appointment from Tuesday morning to Thursday afternoon next week please.",
]
TTS_SENTENCE = "Your table for four people is booked for seven thirty tomorrow evening."  # 12 words
TTS_SENTENCE_WITH_COMMA = "Your table for four is booked, see you at seven thirty tonight."  # 12 words


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    arr = np.asarray(values, dtype=np.float64)
    return {"p50": round(float(np.percentile(arr, 50)), 2), "p95": round(float(np.percentile(arr, 95)), 2),
            "mean": round(float(arr.mean()), 2), "min": round(float(arr.min()), 2),
            "max": round(float(arr.max()), 2), "n": len(values)}


def load_speech_models(settings: Settings):
    from voicepipe.devices import resolve_device
    from voicepipe.models import resolve_model
    from voicepipe.stt import Transcriber
    from voicepipe.stt.model import stt_placement
    from voicepipe.tts import Synthesizer
    from voicepipe.vad import SileroVAD

    models, models_dir = settings.models, settings.paths.models_dir
    device = resolve_device(settings.device)
    stt_device, compute, _ = stt_placement(settings)
    vad = SileroVAD.load(resolve_model(models.vad, "vad", models_dir))
    stt = Transcriber.load(resolve_model(models.stt, "stt", models_dir), settings.stt, stt_device, compute)
    tts = Synthesizer.load(resolve_model(models.tts, "tts", models_dir), settings.tts, use_cuda=device == "cuda")
    return vad, stt, tts


def _speak(tts, text: str) -> np.ndarray:
    clip = tts.synthesize_clause(text)
    return resample(clip.audio * np.float32(0.7), clip.sample_rate, RATE)


def _feed(vad, stt, settings: Settings, audio: np.ndarray, true_end: int, finish_on: str) -> dict:
    """Feed `audio` at real-time pace through a TurnDetector and a TranscriptStream; finish the turn at the
    VAD's `speech_end` or at its `end_of_turn` (with the speech_end sample). Returns the timings."""
    from voicepipe.vad import TurnDetector

    detector = TurnDetector(vad, RATE, settings.vad)
    partials: list = []
    stream = stt.open_stream(RATE, on_partial=partials.append)
    done: dict[str, float] = {}
    future = None
    end_sample = None
    split = 0
    start = time.perf_counter()
    i = 0
    for i in range(0, len(audio), CHUNK):
        chunk = audio[i: i + CHUNK]
        if future is None:
            stream.push(chunk)
        for ev in detector.push(chunk):
            if ev.kind == "speech_end" and future is None:
                end_sample = ev.sample
            if ev.kind == finish_on and future is None:
                done["trigger"] = time.perf_counter()
                future = stream.finish(end_sample)
                future.add_done_callback(lambda _f, d=done: d.setdefault("final", time.perf_counter()))
            elif ev.kind == "speech_start" and future is not None:
                split += 1
        if "true_end" not in done and i + CHUNK >= true_end:
            done["true_end"] = time.perf_counter()
        if future is not None and future.done():
            break
        delay = start + (i + CHUNK) / RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    if future is None:  # the VAD never closed the segment: end the turn at the audio's end
        end_sample = end_sample or len(audio)
        done["trigger"] = time.perf_counter()
        future = stream.finish(end_sample)
    final = future.result(timeout=60)
    done.setdefault("final", time.perf_counter())
    stream.close()
    return {"latency_ms": (done["final"] - done["trigger"]) * 1000,
            "from_true_end_ms": (done["final"] - done["true_end"]) * 1000, "final": final,
            "partials": len(partials), "end_sample": end_sample, "split": split,
            "streamed_s": min(i + CHUNK, len(audio)) / RATE}


def bench_stt(vad, stt, settings: Settings, utterances: list[tuple[str, np.ndarray]],
              progress: Callable[[str], None]) -> dict:
    from voicepipe.stt import corpus_wer

    rng = np.random.default_rng(0)
    latencies, from_true_end, eot_latencies, baseline, stock = [], [], [], [], []
    pairs, partial_counts, reused, reused_eot, split = [], [], 0, 0, 0
    compute_before = stt.stats.decode_seconds
    streamed_audio = 0.0
    eot_silence = settings.vad.end_of_turn_silence_ms / 1000
    for text, clip in utterances:
        lead = RATE // 4
        audio = rng.normal(0, 0.002, lead + len(clip) + round((eot_silence + 0.6) * RATE)).astype(np.float32)
        audio[lead: lead + len(clip)] += clip
        true_end = lead + len(clip)
        # 1) the turn ends at the VAD's speech_end: the hardest case for the streaming final
        run = _feed(vad, stt, settings, audio, true_end, "speech_end")
        streamed_audio += run["streamed_s"]
        latencies.append(run["latency_ms"])
        from_true_end.append(run["from_true_end_ms"])
        reused += run["final"].reused
        split += run["split"]
        pairs.append((text, run["final"].text))
        partial_counts.append(run["partials"])
        # 2) the turn ends at end_of_turn (end_of_turn_silence_ms later), as the call pipeline does it
        eot = _feed(vad, stt, settings, audio, true_end, "end_of_turn")
        streamed_audio += eot["streamed_s"]
        eot_latencies.append(eot["latency_ms"])
        reused_eot += eot["final"].reused
        # Baselines, at the same point: the whole utterance at once.
        whole = audio[: run["end_sample"]]
        t0 = time.perf_counter()
        stt.transcribe(whole)
        baseline.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        segments, _ = stt.decoder.model.transcribe(whole, language=settings.stt.language, beam_size=1,
                                                   without_timestamps=True, condition_on_previous_text=False)
        "".join(s.text for s in segments)
        stock.append((time.perf_counter() - t0) * 1000)
        progress(f"  stt {len(clip) / RATE:4.1f} s: final {latencies[-1]:6.1f} ms (reused={run['final'].reused}), "
                 f"at end_of_turn {eot_latencies[-1]:6.1f} ms, baseline {baseline[-1]:6.1f} ms, "
                 f"stock {stock[-1]:6.1f} ms  {run['final'].text!r}")
    speech_s = sum(len(c) for _, c in utterances) / RATE
    streaming_compute = stt.stats.decode_seconds - compute_before
    three_s = [lat for lat, (_, c) in zip(latencies, utterances, strict=True) if 2.0 <= len(c) / RATE <= 4.0]
    lat, base, stock_stats = _stats(latencies), _stats(baseline), _stats(stock)
    return {
        "final_latency_ms": lat,
        "final_latency_3s_ms": _stats(three_s),
        "final_latency_from_true_speech_end_ms": _stats(from_true_end),
        "final_latency_after_end_of_turn_ms": _stats(eot_latencies),
        "baseline_final_latency_ms": base,
        "stock_baseline_final_latency_ms": stock_stats,
        "ratio_p50": round(lat["p50"] / base["p50"], 3) if base["p50"] else None,
        "ratio_p50_vs_stock": round(lat["p50"] / stock_stats["p50"], 3) if stock_stats["p50"] else None,
        "finals_reused": reused,
        "finals_reused_at_end_of_turn": reused_eot,
        "utterances": len(utterances),
        "utterance_seconds": _stats([len(c) / RATE for _, c in utterances]),
        "vad_split_turns": split,
        "partials_per_utterance": _stats(partial_counts),
        "wer": round(corpus_wer(pairs), 4),
        "rtf": round(sum(baseline) / 1000 / speech_s, 4),
        "stock_rtf": round(sum(stock) / 1000 / speech_s, 4),
        "streaming_compute_rtf": round(streaming_compute / streamed_audio, 4),
    }


def bench_tts(tts, repeats: int, progress: Callable[[str], None]) -> dict:
    from voicepipe.tts import TextChunker

    out = {}
    s = tts.settings
    variants = (("first_audio_ms", TTS_SENTENCE, s.first_chunk_words),
                ("first_audio_comma_ms", TTS_SENTENCE_WITH_COMMA, s.first_chunk_words),
                ("first_audio_whole_clause_ms", TTS_SENTENCE, 0))
    for key, text, first_words in variants:
        firsts = []
        for _ in range(repeats):
            stream = tts.open_stream(s.output_sample_rate)
            stream.chunker = TextChunker(s.min_clause_chars, s.max_clause_chars, first_words)
            start = time.perf_counter()
            for i, word in enumerate(text.split(" ")):
                stream.push_text(word if i == 0 else " " + word)
            stream.end_text()
            stream.read(timeout=30)
            firsts.append((time.perf_counter() - start) * 1000)
            list(stream.frames(timeout=30))
        out[key] = _stats(firsts)
        progress(f"  tts {key}: p50 {out[key]['p50']:.1f} ms")
    synth_before, audio_before = tts.seconds_synthesized, tts.seconds_audio
    for _ in range(max(2, repeats // 2)):
        tts.synthesize_clause(TTS_SENTENCE)
    out["rtf"] = round((tts.seconds_synthesized - synth_before) / (tts.seconds_audio - audio_before), 4)
    out["sentence"] = TTS_SENTENCE
    out["sentence_with_comma"] = TTS_SENTENCE_WITH_COMMA
    out["words"] = len(TTS_SENTENCE.split())
    return out


def bench_vad(vad, audio: np.ndarray, settings: Settings) -> dict:
    from voicepipe.vad import VADStream

    stream = VADStream(vad, RATE, settings.vad)
    frames = len(audio) // CHUNK
    start = time.perf_counter()
    for i in range(frames):
        stream.push(audio[i * CHUNK: (i + 1) * CHUNK])
    seconds = time.perf_counter() - start
    return {"frame_cost_ms": round(seconds * 1000 / frames, 4), "frames": frames,
            "rtf": round(seconds / (frames * 0.02), 5)}


def run_speech_bench(settings: Settings, repeats: int = 10, utterances: int = len(STT_SENTENCES),
                     progress: Callable[[str], None] = print) -> dict:
    started = time.perf_counter()
    progress("loading the VAD, STT and TTS models")
    vad, stt, tts = load_speech_models(settings)
    try:
        tts.synthesize_clause("Warm up.")
        stt.transcribe(np.zeros(RATE, np.float32) + np.float32(0.01) * np.sin(np.arange(RATE, dtype=np.float32)))
        clips = [(text, _speak(tts, text)) for text in STT_SENTENCES[:utterances]]
        progress("TTS: time to first audio")
        tts_report = bench_tts(tts, repeats, progress)
        progress("STT: streaming finals vs whole-utterance baseline (real-time feed)")
        stt_report = bench_stt(vad, stt, settings, clips, progress)
        progress("VAD: cost per 20 ms frame")
        vad_audio = np.concatenate([np.concatenate([c, np.zeros(RATE // 2, np.float32)]) for _, c in clips])
        vad_report = bench_vad(vad, vad_audio, settings)
    finally:
        stt.close()
        tts.close()
    return {
        "stt": stt_report,
        "tts": tts_report,
        "vad": vad_report,
        "targets": {"stt_final_latency_3s_p50_ms": 150, "tts_first_audio_p50_ms": 150},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_avg": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"stt_partial_interval_ms": settings.stt.partial_interval_ms,
                     "tts_min_clause_chars": settings.tts.min_clause_chars,
                     "tts_output_sample_rate": settings.tts.output_sample_rate},
        "seconds": round(time.perf_counter() - started, 1),
    }
