import time

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.cli_helpers import run_cli
from tests.net_helpers import running_server
from voicepipe import __version__
from voicepipe.config import load_settings
from voicepipe.server import create_app


def test_ready_is_false_until_models_are_loaded(settings):
    with TestClient(create_app(settings, load_models=False)) as client:
        assert client.get("/health").json() == {"status": "ok"}
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["ready"] is False


@pytest.mark.e2e
def test_real_server_health_ready_version():
    with running_server() as base:
        assert httpx.get(f"{base}/health").json() == {"status": "ok"}
        ready = httpx.get(f"{base}/ready")
        assert ready.status_code == 200
        assert set(ready.json()["load_seconds"]) == {"vad", "stt", "tts", "llm"}
        assert httpx.get(f"{base}/version").json()["version"] == __version__


@pytest.mark.e2e
def test_app_with_missing_model_reports_why_not_ready(tmp_path):
    with TestClient(create_app(_settings_with_models_dir(tmp_path))) as client:
        for _ in range(100):
            body = client.get("/ready").json()
            if "error" in body:
                break
            time.sleep(0.05)
        assert body["ready"] is False
        assert "voicepipe models fetch" in body["error"]


def test_serve_with_missing_model_fails_fast_with_one_line(tmp_path):
    result = run_cli("--set", f"paths.models_dir={tmp_path}", "serve", "--port", "0", timeout=60)
    assert result.returncode == 2
    assert "is not in" in result.stderr and "voicepipe models fetch" in result.stderr
    assert "Traceback" not in result.stderr


def _settings_with_models_dir(path):
    return load_settings(overrides={"paths": {"models_dir": str(path)}})
