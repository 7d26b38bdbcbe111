"""case.toml and caller.wav: what a valid case holds, and one clear line naming the file and the field for
every malformed one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.cli_helpers import run_cli
from tests.net_helpers import free_port
from tests.replay_fixtures import VALID_CASE, tone, write_case, write_wav
from voicepipe.replay.case import CallerEcho, CaseError, find_cases, load_case


def test_a_valid_case_loads_with_defaults(tmp_path: Path) -> None:
    case = load_case(write_case(tmp_path / "book"))
    assert (case.name, case.transport, case.greeting, case.rate, case.turns) == ("book", "twilio", "Hi.", 8000, 2)
    assert case.deterministic and case.voice_to_voice_p95_ms == 2000 and case.response_p95_ms is None
    assert case.reply.not_contains == ["sorry"]
    first, second = case.expected_turns
    assert (first.golden, first.max_wer, first.golden_max_wer, first.barge_in) == ("Sure, for when?", 0.25, 0.5, None)
    assert (second.barge_in, second.barge_in_stop_ms) == (True, 800)


def test_key_presses_load_in_time_order_each_key_at_its_time(tmp_path: Path) -> None:
    toml = ('[call]\ntransport = "native"\n[[dtmf]]\nat_s = 5\ndigits = "9"\n'
            '[[dtmf]]\nat_s = 2.0\ndigits = "42#"\ngap_s = 0.25\n')
    case = load_case(write_case(tmp_path / "c", toml))
    assert case.keys == [(2.0, "4"), (2.25, "2"), (2.5, "#"), (5, "9")]
    assert load_case(write_case(tmp_path / "d")).keys == []


def test_a_speakerphone_echo_path_and_the_echo_parameter_load(tmp_path: Path) -> None:
    toml = '[call]\ntransport = "twilio"\necho = true\n[echo]\ndelay_ms = 150\nlevel_db = -10.5\n'
    case = load_case(write_case(tmp_path / "c", toml))
    assert case.echo == CallerEcho(150, -10.5) and case.echo_cancelling is True
    plain = load_case(write_case(tmp_path / "d"))
    assert plain.echo is None and plain.echo_cancelling is None


def test_the_turn_count_defaults_to_the_turn_tables(tmp_path: Path) -> None:
    case = load_case(write_case(tmp_path / "c", '[call]\ntransport = "native"\n[[turn]]\ntranscript = "hi"\n'))
    assert case.turns == 1


def test_a_stereo_recording_is_read_as_its_left_channel_at_any_rate(tmp_path: Path) -> None:
    left, right = tone(0.3, 22050), np.full(int(0.3 * 22050), 1234, np.int16)
    directory = write_case(tmp_path / "c", '[call]\ntransport = "native"\n')
    write_wav(directory / "caller.wav", [left, right], 22050)
    case = load_case(directory)
    assert case.rate == 22050 and np.array_equal(case.audio, left)


@pytest.mark.parametrize(("toml", "where", "problem"), [
    ('[expect]\nturns = 1\n', "call", "missing required field"),
    ('[call]\ngreeting = "Hi"\n', "call.transport", "missing required field"),
    ('[call]\ntransport = "sip"\n', "call.transport", "'sip' is not one of"),
    ('[call]\ntransport = 3\n', "call.transport", "must be a string, got an integer"),
    ('[call]\ntransport = "twilio"\ndeterministic = "yes"\n', "call.deterministic", "must be true or false"),
    ('[call]\ntransport = "twilio"\ncolour = "red"\n', "call.colour", "unknown field"),
    ('[call]\ntransport = "twilio"\n[expect]\nturns = "3"\n', "expect.turns", "must be an integer, got a string"),
    ('[call]\ntransport = "twilio"\n[expect]\nturns = true\n', "expect.turns", "must be an integer, got a boolean"),
    ('[call]\ntransport = "twilio"\n[expect]\nresponse_p95_ms = -5\n', "expect.response_p95_ms", "must be >= 0"),
    ('[call]\ntransport = "twilio"\n[expect]\nnot_contains = "sorry"\n', "expect.not_contains",
     "must be a list of strings"),
    ('[call]\ntransport = "twilio"\n[expect]\ncontains = [1]\n', "expect.contains", "list of non-empty strings"),
    ('[call]\ntransport = "twilio"\n[expect]\nturns = 0\n[[turn]]\ntranscript = "a"\n', "expect.turns",
     "fewer than the 1 [[turn]] tables"),
    ('[call]\ntransport = "twilio"\n[[turn]]\nmax_wer = 0.2\n', "turn[0].transcript", "missing required field"),
    ('[call]\ntransport = "twilio"\n[[turn]]\ntranscript = "a"\n[[turn]]\ntranscript = "b"\nmax_wer = "low"\n',
     "turn[1].max_wer", "must be a number"),
    ('[call]\ntransport = "twilio"\n[[turn]]\ntranscript = "a"\nregex = ["(unclosed"]\n', "turn[0].regex[0]",
     "not a valid regex"),
    ('[call]\ntransport = "twilio"\n[[turn]]\ntranscript = "a"\nbarge_in_stop_ms = 500\n',
     "turn[0].barge_in_stop_ms", "needs barge_in = true"),
    ('[call]\ntransport = "twilio"\nturn = 3\n', "call.turn", "unknown field"),
    ('[call]\ntransport = "twilio"\n[turn]\ntranscript = "a"\n', "turn", "must be an array of tables"),
    ('[call\ntransport = "twilio"\n', "syntax", "not valid TOML"),
    # found by fuzzing: a NaN budget passed every range check and then failed every turn without saying why
    ('[call]\ntransport = "twilio"\n[[turn]]\ntranscript = "a"\nmax_wer = nan\n', "turn[0].max_wer",
     "must be a number, got nan"),
    ('[call]\ntransport = "twilio"\n[expect]\nresponse_p95_ms = nan\n', "expect.response_p95_ms", "got nan"),
    ('[call]\ntransport = "twilio"\n[[dtmf]]\nat_s = 1\ndigits = "12x"\n', "dtmf[0].digits", "must be keys"),
    ('[call]\ntransport = "twilio"\n[[dtmf]]\ndigits = "1"\n', "dtmf[0].at_s", "missing required field"),
    ('[call]\ntransport = "twilio"\n[[dtmf]]\nat_s = -1\ndigits = "1"\n', "dtmf[0].at_s", "must be >= 0"),
    ('[call]\ntransport = "twilio"\n[[dtmf]]\nat_s = 1\ndigit = "1"\n', "dtmf[0].digit", "unknown field"),
    ('[call]\ntransport = "twilio"\n[dtmf]\nat_s = 1\n', "dtmf", "must be an array of tables"),
    ('[call]\ntransport = "twilio"\necho = "on"\n', "call.echo", "must be true or false, got a string"),
    ('[call]\ntransport = "twilio"\necho = 150\n', "call.echo", "must be true or false, got an integer"),
    ('[call]\ntransport = "twilio"\n[echo]\ndelay_ms = 150\n', "echo.level_db", "missing required field"),
    ('[call]\ntransport = "twilio"\n[echo]\nlevel_db = -10\n', "echo.delay_ms", "missing required field"),
    ('[call]\ntransport = "twilio"\n[echo]\ndelay_ms = -5\nlevel_db = -10\n', "echo.delay_ms",
     "must be between 0 and 2000"),
    ('[call]\ntransport = "twilio"\n[echo]\ndelay_ms = 150\nlevel_db = 6\n', "echo.level_db",
     "must be between -80 and 0"),
    ('[call]\ntransport = "twilio"\n[echo]\ndelay_ms = 150\nlevel_db = "-10"\n', "echo.level_db",
     "must be a number, got a string"),
    ('[call]\ntransport = "twilio"\n[echo]\ndelay_ms = 150\nlevel_db = -10\nir = "room"\n', "echo.ir",
     "unknown field"),
    ('[call]\ntransport = "twilio"\necho = [1]\n[echo]\n', "call.echo", "must be true or false"),
    ('[call]\ntransport = "twilio"\n[[echo]]\ndelay_ms = 150\n', "echo", "must be a table"),
])
def test_a_malformed_case_names_the_file_and_the_field(tmp_path: Path, toml: str, where: str, problem: str) -> None:
    directory = write_case(tmp_path / "bad", toml)
    with pytest.raises(CaseError) as info:
        load_case(directory)
    message = str(info.value)
    assert message.startswith(f"{directory / 'case.toml'}: {where}: "), message
    assert problem in message and "\n" not in message


def test_a_missing_or_non_audio_wav_is_named(tmp_path: Path) -> None:
    directory = write_case(tmp_path / "c", '[call]\ntransport = "twilio"\naudio = "other.wav"\n')
    with pytest.raises(CaseError, match=r"case.toml: call.audio: .*other.wav: the file does not exist"):
        load_case(directory)
    (directory / "other.wav").write_text("this is not audio")
    with pytest.raises(CaseError, match=r"call.audio: .*other.wav: not a PCM WAV file"):
        load_case(directory)
    write_wav(directory / "other.wav", [np.zeros(0, np.int16)])
    with pytest.raises(CaseError, match=r"call.audio: .*holds no audio"):
        load_case(directory)


def test_find_cases_takes_cases_and_directories_of_cases(tmp_path: Path) -> None:
    a, b = write_case(tmp_path / "suite" / "a"), write_case(tmp_path / "suite" / "b")
    assert find_cases([tmp_path / "suite"]) == [a, b]
    assert find_cases([b]) == [b]
    with pytest.raises(CaseError, match="does not exist"):
        find_cases([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaseError, match="no case.toml"):
        find_cases([tmp_path / "empty"])


def test_the_command_prints_one_error_line_and_exits_2(tmp_path: Path) -> None:
    directory = write_case(tmp_path / "bad", VALID_CASE.replace("turns = 2", "turns = 'two'"))
    proc = run_cli("replay", str(directory), "--url", "http://127.0.0.1:9")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "case.toml: expect.turns: must be an integer, got a string" in lines[0], lines


def test_a_case_that_fails_exits_1_with_its_reports(tmp_path: Path) -> None:
    directory = write_case(tmp_path / "book")
    proc = run_cli("replay", str(directory), "--url", f"http://127.0.0.1:{free_port()}", "--report-dir",
                   str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "| **FAIL** | book | call | call | a completed call with the server's record | ConnectionRefusedError" \
        in proc.stdout
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"report.json", "junit.xml", "summary.md"}


def test_an_audio_name_the_filesystem_refuses_is_named(tmp_path: Path) -> None:
    """Found by fuzzing: a name over the filesystem's limit escaped as OSError."""
    directory = write_case(tmp_path / "c", f'[call]\ntransport = "twilio"\naudio = "{"a" * 300}.wav"\n')
    with pytest.raises(CaseError, match=r"call.audio: .*: cannot be read \(File name too long\)"):
        load_case(directory)
