"""One faster-whisper decode of an utterance, without 30 s padding, optionally continuing a forced prefix.

faster-whisper's `transcribe` pads every window to 30 s, so the encoder costs the same for 1 s as for 30 s.
CTranslate2's Whisper encoder accepts shorter inputs, so a streaming decode encodes only the audio so far
(plus a short tail of silence), and the decoder continues after the tokens already committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voicepipe.stt.agreement import group_words

SAMPLE_RATE = 16000
TAIL_PAD_S = 1.0  # silence appended: whisper drops or garbles the last words of audio cut right after them
MIN_AUDIO_S = 1.0  # shorter audio is padded with silence up to this
SILENCE_RMS = 1e-3  # quieter audio is not decoded at all (whisper invents words in silence)


@dataclass
class DecodeResult:
    tokens: list[int]  # the whole hypothesis, the forced prefix included
    text: str
    no_speech_prob: float
    avg_logprob: float
    samples: int  # audio samples decoded (16 kHz)
    skipped: bool = False  # True when the audio was silent and no model ran
    dropped_text: str = ""  # what whisper heard but the no-speech filter dropped (for the logs)


class WhisperDecoder:
    """Wraps a `faster_whisper.WhisperModel`: features, encoder and decoder calls, and the prompt layout."""

    def __init__(self, model, language: str | None = "en", beam_size: int = 1) -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model = model
        multilingual = model.model.is_multilingual
        self.tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe",
                                   language=(language or "en") if multilingual else None)
        self.beam_size = beam_size
        self.suppress = list(get_suppressed_tokens(self.tokenizer, [-1]))
        self._piece_cache: dict[int, str] = {}

    def decode_tokens(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def piece(self, token: int) -> str:
        text = self._piece_cache.get(token)
        if text is None:
            text = self._piece_cache[token] = self.tokenizer.decode([token])
        return text

    def context_tokens(self, initial_prompt: str | None, hotwords: str | None) -> list[int]:
        text = " ".join(p.strip() for p in (initial_prompt, hotwords) if p and p.strip())
        if not text:
            return []
        return self.tokenizer.encode(" " + text)[-200:]

    def prompt(self, context: list[int], prefix: list[int]) -> list[int]:
        head = [self.tokenizer.sot_prev, *context] if context else []
        return [*head, *self.tokenizer.sot_sequence, self.tokenizer.no_timestamps, *prefix]

    def features(self, audio: np.ndarray) -> np.ndarray:
        pad = max(round(TAIL_PAD_S * SAMPLE_RATE), round(MIN_AUDIO_S * SAMPLE_RATE) - len(audio))
        padded = np.concatenate([audio, np.zeros(pad, dtype=np.float32)])
        feats = self.model.feature_extractor(padded)
        frames = min(feats.shape[-1] - feats.shape[-1] % 2, 3000)
        return np.ascontiguousarray(feats[:, :frames], dtype=np.float32)

    def decode(self, audio: np.ndarray, context: list[int] | None = None, prefix: list[int] | None = None,
               ) -> DecodeResult:
        """Decode 16 kHz float32 audio (at most 30 s); the result starts with `prefix`."""
        prefix = list(prefix or [])
        if len(audio) == 0 or float(np.sqrt(np.mean(np.square(audio)))) < SILENCE_RMS:
            return DecodeResult([], "", 1.0, 0.0, len(audio), skipped=True)
        return self.decode_batch([audio], [context or []], [prefix])[0]

    def decode_batch(self, audios: list[np.ndarray], contexts: list[list[int]], prefixes: list[list[int]],
                     ) -> list[DecodeResult]:
        """Decode several utterances in one encoder and one decoder call (padded to the longest)."""
        import ctranslate2

        feats = [self.features(a[-30 * SAMPLE_RATE:]) for a in audios]
        width = max(f.shape[-1] for f in feats)
        batch = np.stack([np.pad(f, ((0, 0), (0, width - f.shape[-1])), constant_values=f.min()) for f in feats])
        encoded = self.model.model.encode(ctranslate2.StorageView.from_array(batch), to_cpu=False)
        prompts = [self.prompt(c, p) for c, p in zip(contexts, prefixes, strict=True)]
        seconds = max(len(a) for a in audios) / SAMPLE_RATE
        max_new = int(8 + 5 * seconds)
        # Seen with CTranslate2 4.8: the output stops near max_length / 2 tokens, so allow twice the budget.
        max_length = min(448, 2 * (max(len(p) for p in prompts) + max_new))
        results = self.model.model.generate(
            encoded, prompts, beam_size=self.beam_size, max_length=max_length,
            return_scores=True, return_no_speech_prob=True, suppress_blank=not any(prefixes),
            suppress_tokens=self.suppress, repetition_penalty=1.0,
            no_repeat_ngram_size=0,
        )
        out = []
        for audio, prefix, res in zip(audios, prefixes, results, strict=True):
            # The result holds the forced prefix followed by the new tokens.
            tokens = [t for t in res.sequences_ids[0] if t < self.tokenizer.eot]
            if tokens[: len(prefix)] != prefix:
                tokens = [*prefix, *tokens]
            tokens = cut_repetition(tokens, self.piece, len(prefix))
            score = res.scores[0] if res.scores else 0.0
            text = self.tokenizer.decode(tokens).strip()
            avg = float(score)
            dropped = ""
            if res.no_speech_prob > 0.6 and avg < -1.0:
                tokens, text, dropped = [], "", text
            out.append(DecodeResult(tokens, text, float(res.no_speech_prob), avg, len(audio), dropped_text=dropped))
        return out


def cut_repetition(tokens: list[int], piece: Callable[[int], str], keep: int = 0) -> list[int]:
    """Cut a hallucinated loop where it starts: at the second occurrence of any 3-word sequence, or where a sentence
    ends and the utterance starts over ("... my order. I would"), whichever comes first. Whisper can do both in one
    decode ("Thank you. That is all I needed to know. That is all I needed to know. Thank you."): cut at the
    utterance's restart alone, the repeated sentence stayed in. `keep`: never cut into the first `keep` tokens (a
    forced prefix); a 3-word loop inside them leaves the tokens as they are."""
    words = group_words(tokens, piece)
    keys = [w.key for w in words]
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words)):
        gram = tuple(keys[i:i + 3])
        loop = len(gram) == 3 and all(gram) and gram in seen
        restart = i > 0 and words[i - 1].text.rstrip().endswith((".", "?", "!")) and _restarts(keys, i)
        if loop or restart:
            cut = [t for w in words[:i] for t in w.tokens]
            if len(cut) >= keep:
                return cut
            if loop:
                return tokens
        seen.add(gram)
    return tokens


def _restarts(keys: list[str], i: int) -> bool:
    """keys[i:] repeats the start of the utterance (its last word may be cut short)."""
    tail, head = keys[i:], keys[: len(keys) - i]
    if not tail or not tail[-1]:
        return False
    return tail[:-1] == head[:-1] and head[-1].startswith(tail[-1])
