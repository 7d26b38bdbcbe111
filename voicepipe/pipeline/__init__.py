"""pipeline room (see docs/architecture.md): the per-call state machine that wires VAD, STT, the LLM engine and TTS."""

from voicepipe.observability.records import CallRecord, TurnRecord
from voicepipe.pipeline.registry import CallRegistry
from voicepipe.pipeline.resources import CallResources, call_resources
from voicepipe.pipeline.session import AgentOutput, CallSession, CallState

__all__ = ["AgentOutput", "CallRecord", "CallRegistry", "CallResources", "CallSession", "CallState", "TurnRecord",
           "call_resources"]
