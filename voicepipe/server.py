"""The FastAPI app: health, readiness, version; later rooms mount their routers here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from voicepipe import __version__
from voicepipe.auth import check_http_token
from voicepipe.config import Settings
from voicepipe.llm.api import create_openai_router
from voicepipe.observability.api import close_call_store, create_calls_api_router, open_call_store
from voicepipe.observability.dashboard import install_dashboard
from voicepipe.observability.hooks import Observers
from voicepipe.observability.loop_lag import watch_loop_lag
from voicepipe.observability.recorder import CallRecorder
from voicepipe.runtime import Runtime
from voicepipe.transports.gateway import create_call_router
from voicepipe.transports.limits import ws_max_size
from voicepipe.transports.sip import create_sip_router, hang_up_sip_calls
from voicepipe.transports.webrtc import create_webrtc_router, hang_up_webrtc_calls
from voicepipe.web import mount_sipphone, mount_softphone

log = logging.getLogger(__name__)


def create_app(settings: Settings, load_models: bool = True) -> FastAPI:
    runtime = Runtime(settings)
    recorder = CallRecorder(settings.paths.recordings_dir, settings.observability.record_calls)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(open_call_store, app)
        loading = None
        if load_models:
            loading = asyncio.create_task(asyncio.to_thread(runtime.load), name="load-models")
            loading.add_done_callback(_log_load_failure)
        watching = None
        if hasattr(app.state, "metrics"):
            watching = asyncio.create_task(_watch_loop_once_loaded(loading, app.state.metrics.loop_lag.observe),
                                           name="loop-lag")
        yield
        if watching is not None:
            watching.cancel()
        await hang_up_webrtc_calls(app)  # WebRTC calls are no connections uvicorn knows to close
        await hang_up_sip_calls(app)  # nor are SIP calls' peers (their WebSockets are closed by now)
        if loading is not None and not loading.done():
            await asyncio.wait([loading])  # the thread cannot be interrupted; let it finish cleanly
        await asyncio.to_thread(runtime.close)
        await asyncio.to_thread(recorder.close)
        await close_call_store(app)  # after the calls: their last records are committed

    app = FastAPI(title="voicepipe", version=__version__, lifespan=lifespan)
    app.state.runtime = runtime
    app.state.settings = settings
    app.state.observers = Observers([recorder])  # the call store and the metrics register here too
    app.include_router(create_call_router(app))
    app.include_router(create_openai_router(app))
    app.include_router(create_calls_api_router())
    install_dashboard(app)
    app.include_router(create_webrtc_router(app))
    app.include_router(create_sip_router(app))
    if settings.sip.enabled:
        mount_sipphone(app)
    mount_softphone(app)
    if settings.observability.metrics:
        _mount_metrics(app)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": "The models are loading, or failed to"}})
    async def ready() -> JSONResponse:
        """200 while this process takes calls: models loaded, not draining, under calls.max_concurrent."""
        admission = app.state.admission.snapshot()
        accepting = runtime.ready and not admission["draining"] and not admission["saturated"]
        body = {"ready": accepting, "models_loaded": runtime.ready, "load_seconds": runtime.load_seconds,
                **{key: admission[key] for key in ("active_calls", "max_concurrent", "saturated", "draining")}}
        if runtime.load_error:
            body["error"] = runtime.load_error
        return JSONResponse(body, status_code=200 if accepting else 503)

    @app.get("/version")
    async def version() -> dict:
        return {"name": "voicepipe", "version": __version__}

    return app


def _mount_metrics(app: FastAPI) -> None:
    """GET /metrics (Prometheus text, behind `calls.auth_token`); the metrics observe the calls and the engine's
    requests."""
    from voicepipe.observability.metrics import Metrics
    from voicepipe.observability.metrics_live import AdmissionCollector

    runtime: Runtime = app.state.runtime
    calls = app.state.calls  # the gateway's CallRegistry: a call is in it before it starts

    def call_session(call_id: str):
        return getattr(calls.active.get(call_id), "session", None)

    metrics = Metrics(engine=lambda: runtime.engine, call_session=call_session,
                      call_store=lambda: getattr(app.state, "call_store", None))
    metrics.registry.register(AdmissionCollector(app.state.admission.snapshot))
    app.state.metrics = metrics
    app.state.observers.add(metrics)
    runtime.request_listeners.append(metrics.request_finished)

    @app.get("/metrics", include_in_schema=False)
    def prometheus_metrics(request: Request) -> Response:  # sync: FastAPI runs it in a worker thread (engine lock)
        check_http_token(request)  # the figures reveal the live calls and the engine's state
        body, content_type = metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})


async def _watch_loop_once_loaded(loading: asyncio.Task | None, observe: Callable[[float], None]) -> None:
    """The event loop's lag from when the models are loaded (no call is taken before): loading them holds the loop
    up to ~0.5 s at a time (onnxruntime builds the TTS voice's session without letting go of the GIL)."""
    if loading is not None:
        await asyncio.wait([loading])
    await watch_loop_lag(observe)


def _log_load_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("model loading failed: %s", task.exception())


def run_server(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` under uvicorn until it is stopped; SIGTERM drains it first (`DrainingServer`)."""
    import uvicorn

    from voicepipe.drain import DrainingServer

    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port,
                            log_level=settings.server.log_level,
                            ws_max_size=ws_max_size(settings.calls.max_frame_bytes))
    DrainingServer(config, app.state.admission, settings.server.drain_timeout_s).run()


@contextmanager
def serve_in_thread(settings: Settings, ready_timeout: float = 300) -> Iterator[tuple[str, FastAPI]]:
    """The app under uvicorn in a background thread on a free loopback port; yields ``(base_url, app)`` once
    /ready is true. For benchmarks, replays and tests that drive a real server and look inside it."""
    import socket
    import threading

    import uvicorn

    app = create_app(settings)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                          ws_max_size=ws_max_size(settings.calls.max_frame_bytes)))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        def failure() -> str | None:
            error = app.state.runtime.load_error
            return f"the server could not load its models: {error}" if error else None

        wait_until_ready(base, ready_timeout, failure)
        app.state.serve_loop = server.servers[0].get_loop()  # for benches that look inside (bench soak)
        yield base, app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wait_until_ready(base: str, timeout: float, failure: Callable[[], str | None]) -> None:
    """Poll ``base``/ready until it answers 200; raise when ``failure()`` names a reason or time runs out."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = failure()
        if reason:
            raise RuntimeError(reason)
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server never became ready")
