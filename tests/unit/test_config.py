import json

import pytest

from tests.cli_helpers import run_cli
from voicepipe.config import load_settings
from voicepipe.errors import SettingsError


def show(*args, env=None, cwd=None):
    result = run_cli(*args, "config", "show", env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_defaults_are_sane(tmp_path):
    effective = show(cwd=tmp_path)
    assert effective["server"]["port"] == 8000
    assert effective["models"]["llm"] == "smollm2-135m-instruct"
    assert effective["device"]["device"] == "auto"


def test_precedence_flag_over_env_over_toml(tmp_path):
    toml = tmp_path / "vp.toml"
    toml.write_text('[server]\nport = 7001\nhost = "0.0.0.0"\n[models]\nstt = "/opt/whisper"\n')
    from_file = show("--config", str(toml), cwd=tmp_path)
    assert (from_file["server"]["port"], from_file["server"]["host"]) == (7001, "0.0.0.0")

    env = {"VOICEPIPE_SERVER__PORT": "7002"}
    from_env = show("--config", str(toml), env=env, cwd=tmp_path)
    assert from_env["server"]["port"] == 7002
    assert from_env["server"]["host"] == "0.0.0.0"  # untouched keys still come from the file

    from_flag = show("--config", str(toml), "--set", "server.port=7003", env=env, cwd=tmp_path)
    assert from_flag["server"]["port"] == 7003
    assert from_flag["models"]["stt"] == "/opt/whisper"


def test_toml_found_through_env_and_cwd(tmp_path):
    (tmp_path / "voicepipe.toml").write_text("[server]\nport = 7010\n")
    assert show(cwd=tmp_path)["server"]["port"] == 7010
    other = tmp_path / "other.toml"
    other.write_text("[server]\nport = 7011\n")
    assert show(env={"VOICEPIPE_CONFIG": str(other)}, cwd=tmp_path)["server"]["port"] == 7011


def test_secrets_are_masked(tmp_path):
    effective = show("--set", "server.api_key=sk-very-secret", cwd=tmp_path)
    assert effective["server"]["api_key"] == "**********"
    result = run_cli("--set", "server.api_key=sk-very-secret", "config", "show", cwd=tmp_path)
    assert "sk-very-secret" not in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--set", "server.portt=1"], {}, "unknown setting 'server.portt'"),
        ([], {"VOICEPIPE_SERVR__PORT": "1"}, "VOICEPIPE_SERVR__PORT"),
        (["--set", "server.port=abc"], {}, "setting 'server.port'"),
        (["--set", "device.device=tpu"], {}, "setting 'device.device'"),
        (["--config", "/nonexistent.toml"], {}, "/nonexistent.toml does not exist"),
        (["--set", "noequals"], {}, "is not KEY=VALUE"),
    ],
)
def test_bad_settings_give_one_clear_line(tmp_path, args, env, needle):
    result = run_cli(*args, "config", "show", env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_unknown_key_in_toml_is_rejected(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text("[server]\nprot = 1\n")
    with pytest.raises(SettingsError, match="unknown setting 'server.prot'"):
        load_settings(toml)


# Found by fuzzing (voicepipe bench fuzz): each of these escaped the loader as a traceback.
@pytest.mark.parametrize(("text", "needle"), [
    (b"port = \n", "cannot be read: Invalid value"),
    (b'"\\ud800" = 1\n', "cannot be read: Escaped character is not a Unicode scalar value"),
    (b"\xff\xfe", "cannot be read: 'utf-8' codec can't decode"),
])
def test_a_config_file_that_is_no_toml_is_one_settings_error(tmp_path, text, needle):
    toml = tmp_path / "voicepipe.toml"
    toml.write_bytes(text)
    with pytest.raises(SettingsError, match="cannot be read") as info:
        load_settings(toml)
    assert needle in str(info.value) and str(toml) in str(info.value)


def test_a_flag_that_sets_a_section_and_a_key_in_it_is_one_settings_error():
    with pytest.raises(SettingsError, match="'calls' was set as a value, not a section"):
        load_settings(set_pairs=["calls=", "calls.greeting=hi"])


def test_a_list_setting_from_the_environment_that_is_no_json_is_one_settings_error(monkeypatch):
    monkeypatch.setenv("VOICEPIPE_CALLS__ICE_SERVERS", "{x")
    with pytest.raises(SettingsError, match="error parsing value for field \"calls\"") as info:
        load_settings()
    assert "takes JSON in an environment variable" in str(info.value)


@pytest.mark.parametrize(("calls", "needle"), [
    ({"webhook_tools": [{"name": "end_call", "url": "http://x"}]}, "not a built-in's: end_call"),
    ({"webhook_tools": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}, "unique"),
    ({"webhook_tools": [{"name": "has space", "url": "http://x"}]}, "calls.webhook_tools.0.name"),
    ({"webhook_tools": [{"name": "a", "url": "ftp://x"}]}, "calls.webhook_tools.0.url"),
    ({"tools": ["order_pizza"]}, "calls.tools.0"),
    ({"tool_choice": "lookup"}, "tool_choice 'lookup' is not auto, required, none or one of the tools"),
    ({"dtmf_terminator": "5"}, "calls.dtmf_terminator"),
])
def test_call_tools_and_keypad_settings_are_checked(calls, needle):
    with pytest.raises(SettingsError, match=needle):
        load_settings(overrides={"calls": calls})


def test_a_webhook_tool_from_toml_with_its_secret_header(tmp_path):
    config = tmp_path / "voicepipe.toml"
    config.write_text('[calls]\ntools = ["end_call"]\ntool_choice = "lookup"\n[[calls.webhook_tools]]\n'
                      'name = "lookup"\nurl = "https://example.com/hook"\nheaders = { authorization = "Bearer s3"}\n')
    settings = load_settings(config)
    (tool,) = settings.calls.webhook_tools
    assert tool.headers["authorization"].get_secret_value() == "Bearer s3"
    assert tool.parameters == {"type": "object", "properties": {}} and tool.timeout_s == 5.0
    shown = json.loads(run_cli("--config", str(config), "config", "show").stdout)
    assert shown["calls"]["webhook_tools"][0]["headers"] == {"authorization": "**********"}


def test_a_sip_agent_sets_its_own_tools_and_they_are_checked_like_the_calls_ones() -> None:
    desk = {"tools": ["transfer_call"], "tool_choice": "transfer_call", "transfer_target": "sales"}
    settings = load_settings(overrides={"sip": {"agents": {"desk": desk, "plain": {}}}})
    assert settings.sip.agents["desk"].overrides() == desk and settings.sip.agents["plain"].overrides() == {}
    with pytest.raises(SettingsError, match="sip.agents.desk: tool_choice 'end_call'"):
        load_settings(overrides={"sip": {"agents": {"desk": {"tools": ["transfer_call"], "tool_choice": "end_call"}}}})
    with pytest.raises(SettingsError, match="sip.agents.desk: tool_choice 'transfer_call'"):
        load_settings(overrides={"sip": {"agents": {"desk": {"tool_choice": "transfer_call"}}}})  # no calls.tools
    with pytest.raises(SettingsError, match="in-process engine"):
        load_settings(overrides={"llm": {"backend": "openai", "base_url": "http://llm:8080/v1"},
                                 "sip": {"agents": {"desk": {"tools": ["end_call"]}}}})
