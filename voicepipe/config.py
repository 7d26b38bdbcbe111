"""One settings tree for the whole service.

Precedence, highest first: CLI flags (passed as overrides), ``VOICEPIPE_*`` environment variables
(nested with ``__``, e.g. ``VOICEPIPE_SERVER__PORT=9000``), the TOML file, then the defaults below.
The TOML file is ``--config FILE``, else ``$VOICEPIPE_CONFIG``, else ``./voicepipe.toml`` if present.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceError

from voicepipe.errors import SettingsError

ENV_PREFIX = "VOICEPIPE_"
CONFIG_ENV = "VOICEPIPE_CONFIG"
REPO_ROOT = Path(__file__).resolve().parent.parent


def _default_models_dir() -> Path:
    checkout_models = REPO_ROOT / "models"
    if (checkout_models / "manifest.json").is_file():
        return checkout_models
    return Path.home() / ".local" / "share" / "voicepipe" / "models"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelsSettings(Section):
    """Each entry is a default model name, a local directory, or a hub id."""

    stt: str = "whisper-tiny.en"
    tts: str = "piper-en_US-joe-medium"
    llm: str = "smollm2-135m-instruct"
    vad: str = "silero-vad-v6"
    turn: str = "smart-turn-v3.2"  # the acoustic end-of-turn model (turn.acoustic)


class DeviceSettings(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # "auto": float32 on CPU, bfloat16 on CUDA for the LLM; STT picks int8 on CPU, float16 on CUDA.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # SIGTERM: /ready turns 503, new calls are refused, live calls go on for at most this long, then the process
    # exits 0 (a second SIGTERM exits at once). Kubernetes' terminationGracePeriodSeconds should exceed it.
    drain_timeout_s: float = Field(300.0, ge=0.0, le=86400.0)
    # glibc's malloc arenas for the process (0: glibc's default, 8 per core). Each thread that allocates while
    # another holds an arena gets its own, and freed memory fragments across them: with 8 per core, RSS kept
    # growing under call churn with the bytes in use flat. With 2, the LLM, STT and TTS ran as fast (within 4 %).
    malloc_arenas: int = Field(2, ge=0, le=1024)


class PathsSettings(Section):
    models_dir: Path = Field(default_factory=_default_models_dir)
    data_dir: Path = Path("data")
    recordings_dir: Path = Path("recordings")


class VADSettings(Section):
    """Streaming Silero VAD and the end-of-turn policy."""

    threshold: float = Field(0.5, gt=0.0, lt=1.0)
    # Probability under which a window counts as silence (default: threshold - 0.15).
    neg_threshold: float | None = Field(None, gt=0.0, lt=1.0)
    min_speech_ms: int = Field(96, ge=0, le=5000)  # speech shorter than this is not a turn
    min_silence_ms: int = Field(96, ge=0, le=5000)  # silence that ends a speech segment
    padding_ms: int = Field(20, ge=0, le=1000)  # added before speech_start and after speech_end
    end_of_turn_silence_ms: int = Field(600, ge=0, le=10000)  # silence after speech_end that ends the turn


class TurnSettings(Section):
    """The end-of-turn policy (voicepipe/turns/policy.py): how long the caller's silence lasts before the agent
    answers, from the silence itself, the text so far (the call's LLM) and the sound of the speech (Smart Turn).
    The defaults are `voicepipe bench turns --sweep`'s calibration on its labelled set (README, Turn-taking)."""

    # silence: a fixed vad.end_of_turn_silence_ms (the old rule); text / acoustic / hybrid: a wait set by the evidence
    policy: Literal["silence", "text", "acoustic", "hybrid"] = "text"
    # The acoustic model (models.turn), loaded when the policy weighs the sound or when "on": "on" refuses to start
    # without it, "auto" logs and goes on without it (the policies then use the text), "off" never loads it.
    acoustic: Literal["auto", "on", "off"] = "auto"
    short_wait_ms: int = Field(150, ge=0, le=10000)  # silence that ends a turn the evidence calls complete
    middle_wait_ms: int = Field(1300, ge=0, le=10000)  # ... when the evidence is unsure (or not there yet)
    long_wait_ms: int = Field(2500, ge=0, le=30000)  # ... when it says the caller is mid-thought
    # P(complete) at or above *_complete: complete; below *_incomplete: mid-thought; in between: unsure
    text_complete: float = Field(0.6, ge=0.0, le=1.0)
    text_complete_marked: float = Field(0.3, ge=0.0, le=1.0)  # ... for words the STT ended with . ? or !
    text_incomplete: float = Field(0.003, ge=0.0, le=1.0)
    acoustic_complete: float = Field(0.95, ge=0.0, le=1.01)
    acoustic_incomplete: float = Field(0.05, ge=0.0, le=1.0)
    # hybrid: the sound alone may end a turn it calls complete before the words are known (else it waits for them)
    acoustic_alone: bool = False
    # How long after a pause's speech end its decision may wait for the evidence it awaits (the words' score, the
    # sound's): the decision is taken at the same point of the audio however late they land, up to this bound.
    # `bench turns --cpu-load 1` on 2 cores: the words landed at most 968 ms after the VAD's report quiet, 1364 ms
    # beside a spinning process (p99 827 and 1288 ms); the bound clears the loaded maximum.
    evidence_wait_ms: int = Field(1500, ge=0, le=10000)


class STTSettings(Section):
    """Streaming faster-whisper transcription."""

    device: Literal["auto", "cpu", "cuda"] = "auto"  # "auto": follow device.device
    compute_type: str = "auto"  # "auto": int8 on CPU, float16 on CUDA
    cpu_threads: int = Field(0, ge=0, le=256)  # 0: half the CPU cores, 1 to 4 (voicepipe/stt/model.py)
    language: str | None = "en"
    partial_interval_ms: int = Field(300, ge=50, le=5000)
    initial_prompt: str | None = None  # default vocabulary bias; a call can set its own
    hotwords: str | None = None
    beam_size: int = Field(1, ge=1, le=10)
    max_utterance_s: float = Field(30.0, gt=0.0, le=600.0)  # longer turns keep only the last max_utterance_s
    max_queue: int = Field(64, ge=1, le=10000)  # pending jobs in the shared worker
    stale_partial_ms: int = Field(1000, ge=0, le=60000)  # partial requests older than this are dropped


class TTSSettings(Section):
    """Streaming Piper synthesis and the text chunker."""

    min_clause_chars: int = Field(24, ge=1, le=1000)  # cut at , ; : once a clause is this long
    max_clause_chars: int = Field(200, ge=20, le=5000)  # forced cut at a word boundary past this
    # >0: a reply's first chunk is cut after this many words, so the caller hears it sooner (at some cost to that
    # chunk's prosody); 0: the first chunk is the whole first clause.
    first_chunk_words: int = Field(3, ge=0, le=50)
    # >0: when less than this much of a reply's audio is left to play and nothing is being synthesized, the words
    # received so far are released without waiting for the clause to end, so the caller hears no gap while the LLM
    # is behind (at some cost to prosody); 0: off
    low_water_ms: int = Field(400, ge=0, le=10000)
    output_sample_rate: int = Field(16000, ge=8000, le=48000)
    frame_ms: int = Field(20, ge=5, le=200)
    length_scale: float | None = Field(None, gt=0.1, le=5.0)  # speaking rate (None: the voice's)
    max_queued_s: float = Field(120.0, gt=0.0, le=3600.0)  # audio buffered ahead of playout per stream
    cpu_threads: int = Field(0, ge=0, le=256)  # Piper's onnxruntime threads; 0: onnxruntime's default


class LLMSettings(Section):
    """The LLM engine: paged KV pool, scheduler and context policy."""

    kv_cache_mib: int | None = Field(None, ge=1)  # KV pool size; None: kv_cache_memory_fraction of free memory
    kv_cache_memory_fraction: float = Field(0.2, gt=0.0, le=0.95)
    block_size: int = Field(16, ge=1, le=1024)  # tokens per KV block
    max_tokens_per_step: int = Field(256, ge=1)  # token budget of one step (decodes + prefill chunks)
    max_running: int = Field(32, ge=1)  # sequences in flight at once
    context_tokens: int | None = Field(None, ge=16)  # per-session budget; None: the model's context length
    compaction: bool = True  # over budget: keep the system prompt and the latest turns, recompute once
    compaction_target: float = Field(0.6, gt=0.0, le=1.0)  # compact down to this fraction of the budget
    admission_timeout_s: float = Field(30.0, gt=0.0)  # waiting longer than this: "overloaded" error
    flex_aging_steps: int = Field(64, ge=1)  # a flex request waiting this many steps ranks as priority
    default_max_tokens: int = Field(256, ge=0)
    # CPU float32: pack the linear weights for oneDNN once, so that prefill matmuls stop repacking them on every
    # step and a decode's matrix-vector products use both cores (the packed copies cost those weights' memory once
    # more)
    prepack_linears: bool = True
    # The linear layers' weight format (voicepipe/llm/weights.py): "auto" is the fastest format that passes the
    # quality check at load (on a CPU q4, int8, fp16, else fp32; bf16 on CUDA); an unavailable format is logged and
    # chosen as "auto" chooses
    weights: Literal["auto", "fp32", "fp16", "bf16", "int8", "q4"] = "auto"
    # run Llama-family models through voicepipe's own forward (voicepipe/llm/decoder.py); off: transformers' modules,
    # in the model's own dtype (the path before it, kept for comparison and for models it cannot run)
    fast_decoder: bool = True
    # Speculative decoding of greedy requests (voicepipe/llm/speculative.py): "ngram" drafts from the sequence's own
    # history (prompt lookup), "draft" decodes drafts with llm.draft_model; a decode step verifies up to spec_tokens
    # drafted tokens while it holds at most spec_max_batch decodes. The output is the same tokens either way.
    speculative: Literal["off", "ngram", "draft"] = "ngram"
    spec_tokens: int = Field(4, ge=1, le=32)
    spec_max_batch: int = Field(4, ge=1)
    spec_ngram: int = Field(3, ge=1, le=8)  # the longest n-gram prompt lookup matches (down to 2 tokens)
    draft_model: str | None = None  # llm.speculative = "draft": a model of the same vocabulary, as models.llm
    # on a GPU, decode-only steps replay CUDA graphs captured per batch size (1, 2, 4, ..., 32, padded up) and
    # history length (voicepipe/llm/graphs.py); no effect on a CPU
    cuda_graphs: bool = True
    # after a reply, prefill the chat template's opener of the next user turn while the session is idle
    warm_next_turn: bool = True
    # Where calls' replies come from: "local", the engine above in this process; "openai", any OpenAI-compatible
    # server at base_url (vLLM, SGLang, llama.cpp's server, another voicepipe's /v1): the LLM is not loaded here
    # and the settings above do not apply (voicepipe/llm/remote/, README "Remote LLM engines")
    backend: Literal["local", "openai"] = "local"
    base_url: str | None = None  # e.g. http://vllm:8000/v1
    api_key: SecretStr | None = None  # sent as "Authorization: Bearer ..." to base_url
    model: str | None = None  # the served model's id; None: the first one the server's /v1/models lists
    # the key a multi-replica engine's router hashes each call's requests on (vLLM's production-stack router:
    # --routing-logic session --session-key <this>); the OpenAI "user" field carries the same value
    session_header: str = "X-Session-Id"
    connect_timeout_s: float = Field(2.0, gt=0.0, le=60.0)
    read_timeout_s: float = Field(15.0, gt=0.0, le=600.0)  # the longest wait for the next piece of a reply
    retries: int = Field(2, ge=0, le=10)  # tries again before the first token (connect errors, 429, 5xx)
    # backend "openai": the remote model's tokenizer here (a default model name, a directory or a hub id), so that the
    # end-of-turn policy's end probe can render the chat and ask /v1/completions for the next token's logprobs; None:
    # no text evidence from a remote engine (the text policy then runs on the silence)
    tokenizer: str | None = None

    @model_validator(mode="after")
    def _remote_needs_url(self) -> LLMSettings:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("llm.backend = 'openai' needs llm.base_url (e.g. http://vllm:8000/v1)")
        return self


class IceServer(Section):
    """One STUN/TURN server for WebRTC calls, as in the browser's `RTCIceServer`."""

    urls: list[str] = Field(min_length=1)  # e.g. ["stun:stun.example.org:3478"] or ["turn:turn.example.org"]
    username: str | None = None
    credential: SecretStr | None = None


class WebhookTool(Section):
    """A tool of your own the agent may call in a call: its name, what it does and its arguments' JSON schema (what
    the model sees), and the URL the server POSTs each call to (`{"call_id", "transport", "tool", "arguments",
    "metadata"}`). The answer (text or JSON, cut to `calls.tool_result_chars`) goes back to the model as the tool's
    result; a JSON object's "say" text is spoken word for word as the start of the agent's reply."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    url: str = Field(pattern=r"^https?://")
    timeout_s: float = Field(5.0, gt=0.0, le=120.0)  # longer than this: the model hears that it timed out
    headers: dict[str, SecretStr] = Field(default_factory=dict)  # e.g. an Authorization header (masked in config show)


BUILTIN_TOOLS = ("end_call", "transfer_call", "send_dtmf")
BuiltinTool = Literal["end_call", "transfer_call", "send_dtmf"]


MAX_REPLY_TOKENS = 4096  # the largest reply budget, of the settings or of one call


class CallSettings(Section):
    """Per-call pipeline defaults (a call's start message may override the prompt and the greeting)."""

    system_prompt: str = ("You are a friendly voice assistant on a phone call. Answer in one or two short, "
                          "plain sentences that are easy to say out loud.")
    greeting: str | None = "Hello! How can I help you today?"  # None or "": the agent waits for the caller
    barge_in_min_speech_ms: int = Field(150, ge=0, le=5000)  # caller speech that interrupts the agent
    # Caller speech while the agent talks holds the agent's audio at once (the VAD's speech start), before the
    # barge-in decision; a noise shorter than barge_in_min_speech_ms, or a backchannel, lets it go on where it stopped.
    hold_on_speech: bool = True
    # A reply's first audio goes out only once the VAD has judged the caller's audio up to that moment, so a caller
    # who went on is heard before the agent speaks however late their audio is read; at most this long when the
    # caller's audio is late (a stalled link, a client that sends nothing in silence).
    caller_audio_wait_ms: int = Field(300, ge=0, le=5000)
    # Caller speech that began less than this after a reply's first audio went out answers nothing the caller heard
    # (no one reacts that fast): the caller went on with their turn, which is reopened as if none of the reply had
    # gone out (once per turn), not barged in on. 0: off.
    caller_reaction_ms: int = Field(200, ge=0, le=2000)
    # Start the reply at the VAD's speech end and hold its audio until the end-of-turn decision; dropped if the
    # caller resumes. Saves up to vad.end_of_turn_silence_ms per turn, at the cost of LLM work on false ends.
    preemptive_generation: bool = True
    # While the caller speaks, the LLM prefills the words the STT has committed so far (with llm.warm_next_turn), so
    # the turn's own prefill is only the rest of the message.
    prefill_while_speaking: bool = True
    # While the agent speaks, caller speech interrupts it only once its words are known and are more than a
    # backchannel ("mm-hm", "yeah", "okay": voicepipe/turns/backchannel.py), or once it lasts backchannel_max_ms;
    # meanwhile the agent's audio is held (hold_on_speech) and goes on after a backchannel. Off: any speech of
    # barge_in_min_speech_ms interrupts.
    backchannels: bool = True
    backchannel_max_ms: int = Field(900, ge=0, le=10000)
    # Pause the reply's LLM decoding while the TTS makes its first audio (at most this long; 0: off). On a CPU the
    # two share the cores and the caller waits for that audio, not for the tokens after it.
    first_audio_llm_pause_ms: int = Field(400, ge=0, le=5000)
    # What the agent says when the LLM fails a turn (the backend is down, times out, or breaks off): the call goes
    # on and the turn records the error. None or "": nothing is said
    apology: str | None = "Sorry, I'm having trouble answering right now. Could you say that again in a moment?"
    idle_timeout_s: float = Field(120.0, gt=0.0)  # no caller speech and no agent audio this long: hang up
    max_reply_tokens: int = Field(60, ge=1, le=MAX_REPLY_TOKENS)  # a call may set its own (`max_reply_tokens`)
    temperature: float = Field(0.0, ge=0.0, le=2.0)  # 0: greedy
    max_lead_ms: float = Field(200.0, gt=0.0, le=5000.0)  # agent audio sent ahead of playout
    auth_token: SecretStr | None = None  # shared secret for /ws*: header, ?token=, or Telnyx's auth header
    allow_overrides: bool = True  # the start message may set system_prompt, greeting, max_reply_tokens, ...
    audiosocket_port: int | None = Field(None, ge=0, le=65535)  # Asterisk AudioSocket TCP listener (None: off)
    # WebRTC (/webrtc/offer and the softphone): none by default, so nothing reaches out past loopback/LAN
    ice_servers: list[IceServer] = Field(default_factory=list)
    # Calls this process takes at once, over every transport; one more is refused the way its transport expects
    # (WebSocket close 1013, WebRTC 503, AudioSocket hangup) and /ready answers 503 while full. None: no limit
    max_concurrent: int | None = Field(None, ge=1, le=100000)
    # Per connection, on every call link (WebSocket, WebRTC, AudioSocket): a frame over max_frame_bytes closes it
    # (1009), as does sending more than max_messages_per_s messages a second on average (1008; bursts of 2 s' worth
    # pass); a client address holding max_connections_per_client live calls gets no more (1013, HTTP 429). 0: off.
    max_frame_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    max_messages_per_s: int = Field(200, ge=0)
    max_connections_per_client: int = Field(64, ge=0)
    # Twilio's account auth token: when set, /ws/twilio requires a valid X-Twilio-Signature on the upgrade request
    twilio_auth_token: SecretStr | None = None

    # Keypad (DTMF): keys collect into an entry until the terminator ("" for none), a pause of dtmf_timeout_ms or
    # dtmf_max_digits keys; the entry is then the caller's turn, "[keypad: 4 2 1 7]" to the LLM.
    dtmf_timeout_ms: int = Field(2000, ge=50, le=60000)
    dtmf_max_digits: int = Field(16, ge=1, le=64)
    dtmf_terminator: Literal["#", "*", ""] = "#"
    # Tools the agent may call (README, "Tools in calls"): built-ins by name (end_call: hang up after its goodbye;
    # transfer_call: to transfer_target or where the model says, via the native protocol's event and
    # transfer_webhook; send_dtmf: where the transport can send digits) and webhook tools of your own. None by
    # default: the tools' description lengthens every call's prompt.
    tools: list[BuiltinTool] = Field(default_factory=list)
    webhook_tools: list[WebhookTool] = Field(default_factory=list)
    # "auto" (the model decides; a small model seldom calls), "required" (every reply starts with a call), "none",
    # or a tool's name (every reply calls it); after a call the reply goes on under "auto" (if it was) or "none"
    tool_choice: str = "auto"
    max_tool_rounds: int = Field(2, ge=1, le=10)  # tool calls in one reply; the last round must answer in words
    # the token budget of a generation that must call a tool (tool_choice required or a name); one that may answer
    # in words ("auto") keeps max_reply_tokens, so a call it makes must fit in that
    max_tool_call_tokens: int = Field(96, ge=16, le=4096)
    tool_filler_ms: int = Field(1000, ge=0, le=60000)  # a tool running longer than this gets tool_filler (0: never)
    tool_filler: str = "One moment, please."
    tool_result_chars: int = Field(2000, ge=16, le=100000)  # a longer result is cut before the model reads it
    transfer_target: str | None = None  # where transfer_call goes (None: the model names it)
    transfer_webhook: str | None = Field(None, pattern=r"^https?://")  # POSTed {call_id, transport, target, ...}
    transfer_timeout_s: float = Field(5.0, gt=0.0, le=60.0)

    @model_validator(mode="after")
    def _tools_are_known(self) -> CallSettings:
        names = [t.name for t in self.webhook_tools]
        clash = sorted({n for n in names if n in BUILTIN_TOOLS or names.count(n) > 1})
        if clash:
            raise ValueError(f"webhook tool names must be unique and not a built-in's: {', '.join(clash)}")
        check_tool_choice(self.tool_choice, [*self.tools, *names])
        return self


def check_tool_choice(choice: str, tools: list[str]) -> None:
    if choice not in ("auto", "required", "none", *tools):
        raise ValueError(f"tool_choice {choice!r} is not auto, required, none or one of the tools")


class SipAgent(Section):
    """The call settings of one dialled SIP user part (`sip:support@...` -> `sip.agents.support`); a field left
    unset keeps the `calls` default."""

    system_prompt: str | None = None
    greeting: str | None = None  # "": no greeting
    tools: list[BuiltinTool] | None = None  # e.g. a front desk that transfers (`calls.webhook_tools` still apply)
    tool_choice: str | None = None
    transfer_target: str | None = None  # over SIP, transfer_call sends the phone a REFER to it

    def overrides(self) -> dict[str, Any]:
        """The `calls` fields this agent sets."""
        return self.model_dump(exclude_none=True)


class SipSettings(Section):
    """SIP over WebSocket (RFC 7118) at `/sip` for JsSIP, SIP.js and the web phones built on them; the media is
    WebRTC (the same as /webrtc/offer, with `calls.ice_servers`). The SIP web phone is at `/sipphone`."""

    enabled: bool = True
    domain: str | None = None  # requests for another domain get 404; also the digest realm (else "voicepipe")
    users: dict[str, SecretStr] = Field(default_factory=dict)  # user -> password; empty: no digest auth
    agents: dict[str, SipAgent] = Field(default_factory=dict)  # dialled user part -> its call settings
    max_calls: int | None = Field(None, ge=0)  # live SIP calls; an INVITE over it gets 486 Busy Here (None: no cap)
    register_expires_s: int = Field(600, ge=60, le=86400)  # the longest registration granted
    max_message_bytes: int = Field(65536, ge=4096, le=1 << 20)  # larger SIP messages get 513 Message Too Large


# Every call transport, by the name a call's record carries (transports/gateway.py's PROVIDERS are the middle five).
TRANSPORTS = ("native", "twilio", "telnyx", "vonage", "plivo", "exotel", "audiosocket", "webrtc", "sip")
TELEPHONY = ("twilio", "telnyx", "vonage", "plivo", "exotel", "audiosocket")  # phone lines: echo cancelling on


class EchoSettings(Section):
    """Echo cancelling: the agent's own voice taken out of the caller's audio before the VAD and the STT hear it
    (docs/echo.md). A call's `echo` parameter (true or false) overrides its transport's default."""

    # Per transport: whether its calls cancel echo (a transport not listed: off). On for phone lines; off for
    # browsers over WebRTC (the softphone, the SIP web phone), which cancel echo themselves, and the native /ws.
    enabled: dict[str, bool] = Field(default_factory=lambda: {name: name in TELEPHONY for name in TRANSPORTS})
    filter_ms: int = Field(200, ge=20, le=1000)  # the echo path the filter learns, after the estimated delay
    min_delay_ms: int = Field(0, ge=0, le=1000)  # the echo delays searched, from the agent's audio's playout
    max_delay_ms: int = Field(500, ge=20, le=2000)

    @model_validator(mode="after")
    def _known_transports_and_delays(self) -> EchoSettings:
        unknown = sorted(set(self.enabled) - set(TRANSPORTS))
        if unknown:
            raise ValueError(f"echo.enabled: unknown transports {unknown}; known: {list(TRANSPORTS)}")
        if self.min_delay_ms >= self.max_delay_ms:
            raise ValueError(f"echo.min_delay_ms ({self.min_delay_ms}) must be under max_delay_ms "
                             f"({self.max_delay_ms})")
        return self

    def enabled_for(self, transport: str) -> bool:
        return self.enabled.get(transport, False)


class ObservabilitySettings(Section):
    """The call store, the Prometheus metrics and call recordings."""

    store: bool = True  # keep calls and turns in SQLite (paths.data_dir / "calls.sqlite3")
    # A shared store instead of the SQLite file: "postgresql://user:password@host:5432/db" (several replicas write
    # to one database and each dashboard lists every call); None: the SQLite file
    store_url: SecretStr | None = None
    replica: str | None = None  # this process's name in the store's calls (None: the host name, a pod's name)
    retention_days: float = Field(30.0, gt=0.0)  # calls older than this are deleted
    flush_interval_s: float = Field(0.5, gt=0.0, le=1.0)  # store writes are batched; a crash loses at most this
    # With store_url (a fleet): each replica writes its heartbeat every heartbeat_s; the live calls of a replica
    # whose heartbeat is older than lost_after_s show as lost, and the first replica to see them closes them
    heartbeat_s: float = Field(1.0, gt=0.0)
    lost_after_s: float = Field(5.0, gt=0.0)
    metrics: bool = True  # Prometheus /metrics
    record_calls: bool = False  # stereo WAV + events JSONL under paths.recordings_dir; a call's "record"
    # parameter switches it per call

    @model_validator(mode="after")
    def _lost_after_two_heartbeats(self) -> ObservabilitySettings:
        if self.lost_after_s < 2 * self.heartbeat_s:  # one late heartbeat must not lose a live replica's calls
            raise ValueError(f"lost_after_s ({self.lost_after_s}) must be at least twice heartbeat_s "
                             f"({self.heartbeat_s})")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    models: ModelsSettings = Field(default_factory=ModelsSettings)
    device: DeviceSettings = Field(default_factory=DeviceSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    paths: PathsSettings = Field(default_factory=PathsSettings)
    vad: VADSettings = Field(default_factory=VADSettings)
    turn: TurnSettings = Field(default_factory=TurnSettings)
    stt: STTSettings = Field(default_factory=STTSettings)
    tts: TTSSettings = Field(default_factory=TTSSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    calls: CallSettings = Field(default_factory=CallSettings)
    echo: EchoSettings = Field(default_factory=EchoSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    sip: SipSettings = Field(default_factory=SipSettings)

    @model_validator(mode="after")
    def _tools_need_the_local_engine(self) -> Settings:
        agent_tools = any(agent.tools for agent in self.sip.agents.values())
        if self.llm.backend != "local" and (self.calls.tools or self.calls.webhook_tools or agent_tools):
            raise ValueError("calls.tools, calls.webhook_tools and sip.agents' tools need the in-process engine "
                             "(llm.backend = \"local\"): a remote backend's tool calls are not read yet")
        webhooks = [tool.name for tool in self.calls.webhook_tools]
        for name, agent in self.sip.agents.items():
            tools = self.calls.tools if agent.tools is None else agent.tools
            try:
                check_tool_choice(agent.tool_choice or self.calls.tool_choice, [*tools, *webhooks])
            except ValueError as exc:
                raise ValueError(f"sip.agents.{name}: {exc}") from None
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file (if any) is set per load in load_settings(), via a subclass's model_config.
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def _config_file(explicit: Path | None) -> Path | None:
    if explicit is not None:
        if not explicit.is_file():
            raise SettingsError(f"config file {explicit} does not exist.", "pass an existing TOML file.")
        return explicit
    from_env = os.environ.get(CONFIG_ENV)
    if from_env:
        path = Path(from_env)
        if not path.is_file():
            raise SettingsError(f"{CONFIG_ENV}={from_env} does not exist.", f"unset {CONFIG_ENV} or fix it.")
        return path
    local = Path("voicepipe.toml")
    return local if local.is_file() else None


def _known_env_names(model: type[BaseModel], prefix: str) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        full = f"{prefix}{name.upper()}"
        names.add(full)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= _known_env_names(annotation, full + "__")
    return names


def _check_env_names() -> None:
    known = _known_env_names(Settings, ENV_PREFIX) | {CONFIG_ENV}
    for name in os.environ:
        if name.startswith(ENV_PREFIX) and name not in known:
            raise SettingsError(
                f"unknown setting in environment variable {name}.",
                "check the spelling against `voicepipe config show` (nested keys use __).",
            )


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["server.port=9000", "models.llm=/path"]`` into a nested dict for Settings(**...)."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"override {pair!r} is not KEY=VALUE.", "write e.g. --set server.port=9000.")
        node = tree
        *parents, leaf = key.strip().split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                section = ".".join(parents[: i + 1])
                raise SettingsError(f"override {pair!r}: {section!r} was set as a value, not a section.",
                                    f"set either {section}=... or {section}.KEY=..., not both.")
        node[leaf] = value
    return tree


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    set_pairs: list[str] | None = None,
) -> Settings:
    """Build the effective settings; raises SettingsError with a one-line message on any bad value."""
    _check_env_names()
    init = _merge(parse_overrides(set_pairs or []), overrides or {})
    toml_file = _config_file(config_file)
    settings_cls = type("Settings", (Settings,), {"model_config": {**Settings.model_config, "toml_file": toml_file}})
    try:
        return settings_cls(**init)
    except ValidationError as exc:
        raise SettingsError(_describe_validation_error(exc), "see `voicepipe config show`.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:  # the file, read by the TOML source
        raise SettingsError(f"config file {toml_file} cannot be read: {exc}.", "fix its TOML (UTF-8).") from None
    except SourceError as exc:  # e.g. a list setting's environment variable that is not JSON
        raise SettingsError(f"{exc}.", "a list or table setting takes JSON in an environment variable.") from None


def _describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown setting {where!r}")
        else:
            parts.append(f"setting {where!r}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts) + "."


def masked_dump(settings: Settings) -> dict[str, Any]:
    """Settings as plain data, with secrets shown as ******** (or null when unset)."""
    return settings.model_dump(mode="json")
