"""The `voicepipe` command: serve, call, replay, config, models, bench."""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

from voicepipe.config import Settings, load_settings, masked_dump
from voicepipe.errors import VoicepipeError

app = typer.Typer(help="voicepipe: a one-process voice-agent service.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)
models_app = typer.Typer(help="Fetch, list and verify models.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
bench_app = typer.Typer(help="Benchmarks that report ratios against a baseline measured in the same run.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


class _ReplayGroup(typer.core.TyperGroup):
    """`voicepipe replay CASE...` runs cases (the `run` subcommand); `voicepipe replay init DIR` makes one."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


replay_app = typer.Typer(cls=_ReplayGroup, no_args_is_help=True,
                         help="Replay recorded calls as regression tests: `replay CASE_OR_DIR...`, `replay init`.")
app.add_typer(replay_app, name="replay")

console = Console()
err_console = Console(stderr=True)


class _State:
    config_file: Path | None = None
    set_pairs: list[str] = []
    debug: bool = False


state = _State()


@app.callback()
def main(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a setting, e.g. --set server.port=9000 (repeatable).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks on errors.")] = False,
) -> None:
    state.config_file = config
    state.set_pairs = set_ or []
    state.debug = debug


def settings_with(**overrides) -> Settings:
    """The effective settings: flags given to a command win over --set, env and the TOML file."""
    tree: dict = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition("__")
        tree.setdefault(section, {})[key] = value
    return load_settings(state.config_file, overrides=tree, set_pairs=state.set_pairs)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Start the service (models load in the background; /ready turns true when done)."""
    from voicepipe.server import create_app, run_server

    settings = settings_with(server__host=host, server__port=port, device__device=device)
    logging.basicConfig(level=settings.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app_ = create_app(settings)
    app_.state.runtime.model_paths()  # fail fast, with one clear line, when a model is missing
    run_server(app_, settings)


@app.command()
def call(
    wav: Annotated[Path, typer.Option("--wav", help="16-bit WAV: one or more utterances separated by silence.",
                                      exists=True, dir_okay=False)],
    url: Annotated[str, typer.Option(help="Server URL (ws://host:port; http://host:port for webrtc) or a full "
                                          "endpoint URL.")] =
        "ws://127.0.0.1:8000",
    transport: Annotated[str, typer.Option(
        help="twilio, telnyx, vonage, plivo, exotel, native, webrtc, sip, or audiosocket (--url tcp://host:port).")] =
        "native",
    server_url: Annotated[str | None, typer.Option(
        help="The server's HTTP URL for the call record, when --url is not it (audiosocket).")] = None,
    record: Annotated[Path | None, typer.Option(help="Write the agent's audio (as played) to this WAV.")] =
        Path("agent.wav"),
    token: Annotated[str | None, typer.Option(help="Shared secret (calls.auth_token on the server).")] = None,
    system_prompt: Annotated[str | None, typer.Option(help="Override the agent's system prompt.")] = None,
    greeting: Annotated[str | None, typer.Option(help="Override the greeting ('' for none).")] = None,
    barge_in_after_ms: Annotated[float | None, typer.Option(
        help="Speak each later utterance this long after the agent's reply starts (interrupting it).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the results as JSON.")] = None,
) -> None:
    """Call the agent like a phone provider would: speak a WAV at real-time pace, record the replies."""
    import asyncio

    from voicepipe.caller import TRANSPORTS, call_wav, format_report, result_summary

    if transport not in TRANSPORTS:
        raise typer.BadParameter(f"--transport must be one of {', '.join(TRANSPORTS)}")
    params = {k: v for k, v in (("system_prompt", system_prompt), ("greeting", greeting)) if v is not None}
    result = asyncio.run(call_wav(url, transport, wav, params=params, token=token, record_path=record,
                                  barge_in_after_ms=barge_in_after_ms, record_url=server_url))
    console.print(format_report(result), highlight=False)
    if record is not None:
        console.print(f"agent audio written to {record}")
    if json_out is not None:
        json_out.write_text(json.dumps(result_summary(result), indent=2))


@replay_app.command("run")
def replay_run(
    cases: Annotated[list[Path], typer.Argument(help="Case directories, or directories of cases.")],
    url: Annotated[str | None, typer.Option(
        help="A running server (http://host:port); default: an in-process server on a free port.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Cases replayed at once.")] = 1,
    seed: Annotated[int | None, typer.Option(help="Seed every call's sampling (reproducible replies).")] = None,
    token: Annotated[str | None, typer.Option(help="calls.auth_token of the server.")] = None,
    baseline: Annotated[Path | None, typer.Option(
        help="report.json of an earlier run: flag latency p95 regressions beyond the tolerance.")] = None,
    tolerance: Annotated[float, typer.Option(min=0.0, help="Allowed slowdown against --baseline (0.25: 25%).")] =
        0.25,
    tolerance_ms: Annotated[float, typer.Option(min=0.0, help="... and at least this many ms.")] = 100.0,
    update_golden: Annotated[bool, typer.Option(
        "--update-golden", help="Rewrite the expected agent text of deterministic cases; print the diff.")] = False,
    report_dir: Annotated[Path, typer.Option(help="Where report.json, junit.xml and summary.md go.")] =
        Path("replay-report"),
    repeat: Annotated[int, typer.Option(min=1, help="Replay every case this many times: a case whose turns, "
                                                    "transcripts, barge-ins, reopens or replies differ fails.")] = 1,
    cpu_load: Annotated[int, typer.Option(min=0, help="Processes spinning on the CPU beside the server while the "
                                                      "calls run (a busy machine).")] = 0,
) -> None:
    """Replay each case over its transport at real-time pace; exit 1 when any expectation fails."""
    from voicepipe.replay.case import find_cases
    from voicepipe.replay.reports import write_reports
    from voicepipe.replay.results import load_baseline
    from voicepipe.replay.runner import ReplayOptions, run_replay

    if update_golden and repeat > 1:
        raise VoicepipeError("--update-golden rewrites the golden text from one run.", "leave out --repeat.")
    settings = settings_with()
    if token is None and url is None and settings.calls.auth_token is not None:
        token = settings.calls.auth_token.get_secret_value()
    options = ReplayOptions(url=url, concurrency=concurrency, seed=seed, token=token,
                            baseline=load_baseline(baseline) if baseline is not None else None,
                            tolerance=tolerance, tolerance_ms=tolerance_ms, update_golden=update_golden,
                            repeat=repeat, cpu_load=cpu_load)
    say = lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    report, results = run_replay(find_cases(cases), settings, options, say)
    paths = write_reports(report, results, report_dir)
    say(paths["markdown"].read_text())
    say(f"reports: {paths['json']}, {paths['junit']}, {paths['markdown']}")
    if report["cases_failed"]:
        raise typer.Exit(1)


@replay_app.command("init")
def replay_init(
    recording: Annotated[Path, typer.Argument(help="A recording directory (call.wav and events.jsonl).")],
    out: Annotated[Path | None, typer.Option(help="The case directory to write (default: cases/<call id>).")] =
        None,
) -> None:
    """Turn a recorded call into a case, its expectations pre-filled from that run."""
    from voicepipe.replay.init_case import init_case

    path = init_case(recording, out)
    console.print(f"case written to {path} (case.toml, caller.wav): tighten its expectations", highlight=False)


@config_app.command("show")
def config_show() -> None:
    """Print the effective settings as JSON, secrets masked."""
    print(json.dumps(masked_dump(settings_with()), indent=2))


@models_app.command("fetch")
def models_fetch(
    names: Annotated[list[str] | None, typer.Argument(help="Default models to fetch (all).")] = None,
) -> None:
    """Download, verify and unpack the default models into the models directory."""
    from voicepipe.models import fetch_models

    settings = settings_with()
    fetch_models(settings.paths.models_dir, names)


@models_app.command("list")
def models_list() -> None:
    """Show the default models, whether they are present, and their sizes."""
    from voicepipe.models import dir_size, load_manifest

    models_dir = settings_with().paths.models_dir
    table = Table("name", "kind", "present", "size", "description")
    for name, entry in load_manifest().items():
        path = models_dir / name
        present = path.is_dir()
        size = f"{dir_size(path) / 1e6:.1f} MB" if present else "-"
        table.add_row(name, entry.kind, "yes" if present else "no", size, entry.description)
    console.print(table)
    console.print(f"models directory: {models_dir}")


@models_app.command("verify")
def models_verify(
    names: Annotated[list[str] | None, typer.Argument(help="Models to check (all present).")] = None,
) -> None:
    """Check every file of the fetched models against its sha256."""
    from voicepipe.models import load_manifest, verify_model_dir

    models_dir = settings_with().paths.models_dir
    for name, entry in load_manifest().items():
        if names and name not in names:
            continue
        if not (models_dir / name).is_dir():
            console.print(f"- {name} not fetched")
            continue
        verify_model_dir(entry, models_dir / name)
        console.print(f"[green]✓[/] {name}")


@bench_app.command("call")
def bench_call(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    calls: Annotated[list[int] | None, typer.Option("--calls", help="Concurrent calls per run (repeatable).")] =
        None,
    turns: Annotated[int, typer.Option(min=2, help="Turns per call.")] = 30,
    url: Annotated[str | None, typer.Option(help="A running server (http://host:port); default: in-process.")] =
        None,
    token: Annotated[str | None, typer.Option(help="calls.auth_token of that server.")] = None,
    remote: Annotated[bool, typer.Option(
        help="Run the calls with the LLM in process, then with the LLM on a second voicepipe's /v1 "
             "(llm.backend = openai): remote_over_local_v2v and the remote cached fraction.")] = False,
    dtmf_turns: Annotated[int, typer.Option(min=0, help="Keypad entries typed in one more call (0: none).")] = 10,
    voice: Annotated[bool, typer.Option(help="Run the spoken calls (--no-voice: the keypad call only).")] = True,
) -> None:
    """N concurrent multi-turn Twilio calls: voice-to-voice, response latency and TTFT turn N over turn 2; then one
    call of keypad entries: dtmf_response_ms."""
    from voicepipe.bench.call import run_call_bench

    if remote:
        _bench_remote(json_file, calls or [1], turns)
        return
    report = run_call_bench(settings_with(), calls or [1, 4], turns, url, token, progress=console.print,
                            dtmf_turns=dtmf_turns, voice=voice)
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("calls", "turn policy", "v2v p50", "v2v p95", "response p50", "response p95", "TTFT p50",
                  f"TTFT t{turns}/t2", title="voice calls (ms)")
    for run in report["runs"]:
        v, r, t = run["voice_to_voice_ms"], run["response_ms"], run["ttft_ms"]
        table.add_row(str(run["calls"]), run["policy"], str(v["p50"]), str(v["p95"]), str(r["p50"]), str(r["p95"]),
                      str(t["p50"]), str(run.get(f"ttft_turn{turns}_over_turn2")))
    console.print(table)
    console.print(f"voice_to_voice_ratio ({report['policies'][-1]} / silence) by calls: "
                  f"{report['voice_to_voice_ratio_by_calls']}")
    if "dtmf" in report:
        keys = report["dtmf_response_ms"]
        console.print(f"dtmf_response_ms p50 {keys['p50']} / p95 {keys['p95']} over {keys['n']} keypad turns "
                      f"(target p50 <= {report['dtmf_response_target_p50_ms']:g}: "
                      f"{'met' if report['dtmf_response_meets_target'] else 'NOT met'}; "
                      f"over the spoken response: {report['dtmf_response_over_response']})")


def _bench_remote(json_file: Path | None, calls: list[int], turns: int) -> None:
    from voicepipe.bench.remote import run_remote_bench

    report = run_remote_bench(settings_with(), calls, turns, progress=console.print)
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("calls", "LLM", "v2v p50", "v2v p95", "TTFT p50", "cached from turn 2 (min / p50)",
                  title=f"voice calls, turn policy {report['policy']}, {report['rounds']} alternating rounds (ms)")
    for label in ("local", "remote"):
        for run in report[label]:
            v, t, c = run["voice_to_voice_ms"], run["ttft_ms"], run["cached_fraction_from_turn2"] or {}
            table.add_row(str(run["concurrency"]), label, str(v["p50"]), str(v["p95"]), str(t["p50"]),
                          f"{c.get('min')} / {c.get('p50')}")
    console.print(table)
    console.print(f"remote_over_local_v2v: {report['remote_over_local_v2v']} "
                  f"(by calls {report['remote_over_local_v2v_by_calls']}); "
                  f"remote cached fraction from turn 2: {report['remote_cached_fraction']}")


@bench_app.command("sip")
def bench_sip(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Calls over each signalling for voice-to-voice.")] = 3,
    turns: Annotated[int, typer.Option(min=1, help="Turns per call.")] = 3,
    setups: Annotated[int, typer.Option(min=1, help="Call setups measured over each signalling.")] = 20,
    digest: Annotated[bool, typer.Option(help="SIP calls authenticate (digest): setup includes the 401.")] = False,
) -> None:
    """Call setup (INVITE to 200 OK) and voice-to-voice over SIP vs. the same calls over /webrtc/offer."""
    from voicepipe.bench.sip import run_sip_bench

    report = run_sip_bench(settings_with(), rounds, turns, setups, digest, progress=console.print)
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("signalling", "setup p50", "setup p95", "v2v p50", "v2v p95", title="SIP vs WebRTC (ms)")
    for name in ("sip", "webrtc"):
        s, v = report["setup_ms"][name], report["voice_to_voice_ms"][name]
        table.add_row(name, str(s["p50"]), str(s["p95"]), str(v["p50"]), str(v["p95"]))
    console.print(table)
    response = report["response_ms"]
    console.print(f"sip/webrtc: setup {report['setup_sip_over_webrtc']}, voice-to-voice "
                  f"{report['voice_to_voice_sip_over_webrtc']} (paired by turn: "
                  f"{report['voice_to_voice_paired_ratio']}), server response p50 {response['sip']['p50']} / "
                  f"{response['webrtc']['p50']} ms; targets {report['targets']}")


@bench_app.command("echo")
def bench_echo(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    delays: Annotated[list[int] | None, typer.Option("--delays", help="Echo delays in ms (repeatable).")] = None,
    levels: Annotated[list[int] | None, typer.Option("--levels", help="Echo levels in dB (repeatable).")] = None,
    transports: Annotated[list[str] | None, typer.Option("--transports", help="Transports (repeatable).")] = None,
    barge_ins: Annotated[int, typer.Option("--barge-ins", min=1, help="Barge-ins per echo level, at least.")] = 20,
    at_once: Annotated[int, typer.Option("--calls-at-once", min=1, help="Calls in flight at once.")] = 3,
    cancel: Annotated[bool, typer.Option(help="Echo cancelling on for the grid's transports.")] = True,
) -> None:
    """Speakerphone calls over delays x echo levels x transports, with scripted barge-ins, against the same calls
    without echo: self-interruptions, echo turns, the echo gate's leaks, echo holds, barge-in recall, WER and
    voice-to-voice ratios."""
    from voicepipe.bench.echo import DELAYS_MS, LEVELS_DB, TRANSPORTS, run_echo_bench
    from voicepipe.caller import TRANSPORTS as KNOWN

    unknown = sorted(set(transports or []) - set(KNOWN))
    if unknown:
        raise VoicepipeError(f"unknown transports {unknown}.", f"pick from {list(KNOWN)}.")
    report = run_echo_bench(settings_with(), delays or list(DELAYS_MS), levels or list(LEVELS_DB),
                            transports or list(TRANSPORTS), barge_ins, at_once, cancel,
                            progress=lambda line: err_console.print(line, highlight=False))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    groups = {"clean": report["clean"], **{f"{level} dB": g for level, g in report["by_level"].items()}}
    table = Table("", *groups, title="bench echo")
    for key in ("calls", "self_interruptions", "echo_turns", "echo_gate_leaks", "echo_hold_ms", "agent_speaking_ms",
                "barge_ins_over_agent", "barge_ins_stopped", "voice_to_voice_p50_ms", "wer",
                "wer_double_talk"):
        table.add_row(key, *(str(g[key]) for g in groups.values()))
    console.print(table)
    for key in ("self_interruptions", "echo_turns", "echo_gate_leaks", "echo_hold_ms", "agent_speaking_ms",
                "barge_in_recall_min", "v2v_p50_echo_over_clean", "wer_echo_over_clean",
                "wer_double_talk_echo_over_clean", "echo_cpu_ms_per_s"):
        reason = report["null_reasons"].get(key)
        console.print(f"{key}: {report[key]}" + (f" ({reason})" if reason else ""), highlight=False)
    console.print(f"{report['seconds'] / 60:.1f} min (expected {report['expected_seconds'] / 60:.0f}); "
                  f"failed calls: {len(report['failed_calls'])}", highlight=False)


@bench_app.command("turns")
def bench_turns(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    sweep: Annotated[bool, typer.Option(help="Also search the thresholds that give hybrid its shortest wait.")] =
        False,
    evidence: Annotated[Path | None, typer.Option(
        help="Recorded evidence: replayed if the file exists (seconds, no models), else recorded into it.")] = None,
    cpu_load: Annotated[int, typer.Option(min=0, help="Record the set a second time beside this many processes "
                                                      "spinning on the CPU (a busy machine), in the same run.")] = 0,
) -> None:
    """Every end-of-turn policy over one labelled set: wait after complete sentences, false cut-offs at pauses."""
    from voicepipe.bench.turns import run_turns_bench

    settings = settings_with()
    report = run_turns_bench(settings, settings.paths.data_dir / "turn-corpus", sweep=sweep, evidence_file=evidence,
                             progress=lambda line: err_console.print(line, highlight=False), cpu_load=cpu_load)
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("policy", "wait p50", "wait p95", "false cut-offs", "complete cut", title="end of turn (ms)")
    for name in ("silence", "text", "acoustic", "hybrid"):
        table.add_row(name, *(str(report[f"{name}_{key}"]) for key in
                              ("wait_p50_ms", "wait_p95_ms", "false_cutoff_rate", "complete_cut_rate")))
    console.print(table)
    console.print(f"wait_ratio {report['wait_ratio']} · decision_p95_ms {report.get('decision_p95_ms')} · "
                  f"text evidence {report.get('text_ready_p50_ms')} ms after the VAD's speech end (p50)")
    console.print(f"{report['policy']}: conversational turns ({report['conversational_utterances']}) false cut-offs "
                  f"{report['conversational_false_cutoff_rate']}, wait p50 {report['conversational_wait_p50_ms']} ms"
                  + (f" · loaded: false cut-offs {report['false_cutoff_rate_loaded']}, wait p50 loaded/quiet "
                     f"{report['wait_p50_loaded_over_quiet']}, same decisions {report['same_decisions_rate']}, "
                     f"same evidence {report['same_evidence_rate']}" if "false_cutoff_rate_loaded" in report else "")
                  + (f" · utterances that started late (a reply past its room): {report['late_starts_quiet']} quiet, "
                     f"{report.get('late_starts_loaded', '-')} loaded" if "late_starts_quiet" in report else ""))


@bench_app.command("observability")
def bench_observability(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    calls: Annotated[int, typer.Option(min=1, help="Calls with observability on, and as many with it off.")] = 6,
    turns: Annotated[int, typer.Option(min=1, help="Turns per call.")] = 5,
) -> None:
    """Response latency with the call store, /metrics and recordings on vs. off, calls alternating in one run."""
    from voicepipe.bench.observability import run_observability_bench

    report = run_observability_bench(settings_with(), calls, turns, progress=console.print)
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("observability", "response p50", "response p95", "v2v p50", "v2v p95", title="calls (ms)")
    for name in ("on", "off"):
        r, v = report[name]["response"], report[name]["voice_to_voice"]
        table.add_row(name, str(r["p50"]), str(r["p95"]), str(v["p50"]), str(v["p95"]))
    console.print(table)
    console.print(f"on/off ratios: {report['ratios']}")


@bench_app.command("speech")
def bench_speech(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="TTS first-audio runs per sentence.")] = 10,
    utterances: Annotated[int, typer.Option(min=1, max=10, help="STT utterances (1-6 s each).")] = 10,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Streaming STT final latency vs. whole-utterance baseline, TTS first audio, RTFs, VAD cost per frame."""
    from voicepipe.bench.speech import run_speech_bench

    settings = settings_with(device__device=device)
    report = run_speech_bench(settings, repeats=repeats, utterances=utterances,
                              progress=lambda line: err_console.print(line, highlight=False))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    stt, tts, vad = report["stt"], report["tts"], report["vad"]
    table = Table(title="speech: STT, TTS, VAD (ms)")
    for column in ("figure", "p50", "p95", "note"):
        table.add_column(column)
    table.add_row("STT final after VAD speech end", f"{stt['final_latency_ms']['p50']:.1f}",
                  f"{stt['final_latency_ms']['p95']:.1f}", f"ratio {stt['ratio_p50']} vs baseline")
    table.add_row("  finished at end_of_turn", f"{stt['final_latency_after_end_of_turn_ms']['p50']:.1f}",
                  f"{stt['final_latency_after_end_of_turn_ms']['p95']:.1f}", "as the call pipeline does")
    table.add_row("  baseline: whole utterance", f"{stt['baseline_final_latency_ms']['p50']:.1f}",
                  f"{stt['baseline_final_latency_ms']['p95']:.1f}", f"RTF {stt['rtf']}")
    table.add_row("  stock faster-whisper", f"{stt['stock_baseline_final_latency_ms']['p50']:.1f}",
                  f"{stt['stock_baseline_final_latency_ms']['p95']:.1f}", f"RTF {stt['stock_rtf']}")
    table.add_row("TTS first audio, 12 words", f"{tts['first_audio_ms']['p50']:.1f}",
                  f"{tts['first_audio_ms']['p95']:.1f}", f"RTF {tts['rtf']}")
    table.add_row("  with a comma clause", f"{tts['first_audio_comma_ms']['p50']:.1f}",
                  f"{tts['first_audio_comma_ms']['p95']:.1f}", "")
    table.add_row("  first chunk = whole first clause", f"{tts['first_audio_whole_clause_ms']['p50']:.1f}",
                  f"{tts['first_audio_whole_clause_ms']['p95']:.1f}", "tts.first_chunk_words=0")
    table.add_row("VAD per 20 ms frame", f"{vad['frame_cost_ms']:.3f}", "-", f"{vad['frames']} frames")
    console.print(table)
    console.print(f"STT WER {stt['wer']:.3f}, finals reused {stt['finals_reused']}/{stt['utterances']}, "
                  f"streaming compute RTF {stt['streaming_compute_rtf']}")


@bench_app.command("fuzz")
def bench_fuzz(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the flat report here.")] = None,
    examples: Annotated[int, typer.Option(min=1, help="Examples per target.")] = 5000,
    target: Annotated[list[str] | None, typer.Option("--target", help="Only this target or group (repeatable), "
                                                                      "e.g. twilio or sdp.offer.")] = None,
    seed: Annotated[int | None, typer.Option(help="Make the run reproducible.")] = None,
) -> None:
    """Property-based fuzzing of every parser (the six WebSocket protocols, AudioSocket, SDP offers, replay cases,
    settings): examples tried and errors found per target; exits 1 unless there are 0 errors."""
    try:
        from voicepipe.bench.fuzz import run_fuzz
    except ImportError as exc:
        raise VoicepipeError(f"bench fuzz needs hypothesis ({exc}).", "pip install -e '.[dev]'.") from None
    try:
        report = run_fuzz(examples, only=target, seed_value=seed,
                          progress=lambda line: err_console.print(line, highlight=False))
    except ValueError as exc:
        raise VoicepipeError(str(exc), "pick targets from that list.") from None
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    console.print(f"{report['examples_total']} examples over {report['targets']} targets, "
                  f"{report['errors_total']} errors ({report['seconds_total']} s)")
    for key, value in report.items():
        if key.startswith("finding."):
            console.print(f"{key}: {value}", highlight=False)
    if report["errors_total"]:
        raise typer.Exit(1)


@bench_app.command("soak")
def bench_soak(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    calls: Annotated[int, typer.Option(min=5, help="Calls in all (the first wave warms up).")] = 50,
    wave: Annotated[int, typer.Option(min=1, help="Calls at once.")] = 4,
) -> None:
    """Churn: calls in waves over every call link (barge-ins, abrupt hang-ups, bad frames mixed in) through the
    real models; RSS, fds, threads, tasks, KV blocks, sessions and streams before and after; exits 1 unless every
    bound held and no healthy call lost audio or a turn."""
    from voicepipe.bench.soak import run_soak

    report = run_soak(settings_with(), calls, wave, progress=lambda line: err_console.print(line, highlight=False))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    console.print(f"{calls} calls in {report['seconds']} s; RSS {report['warm.rss_mb']} -> {report['after.rss_mb']} MB "
                  f"after warm-up (+{report['rss_growth_mb']}, bound {report['rss_growth_bound_mb']:g}); "
                  f"healthy calls that lost audio or turns: {report['healthy_calls_lost']}")
    for problem in report["bound_problems"]:
        console.print(f"bound not held: {problem}", highlight=False)
    for call_id, problems in report["unhealthy_calls"].items():
        console.print(f"{call_id}: {'; '.join(problems)}", highlight=False)
    if not report["passed"]:
        raise typer.Exit(1)


@bench_app.command("llm")
def bench_llm(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    turns: Annotated[int, typer.Option(min=2, help="Turns per session.")] = 30,
    concurrency: Annotated[str, typer.Option(help="Comma-separated session counts.")] = "1,4,16",
    reply_tokens: Annotated[int, typer.Option(min=2, help="Tokens per reply.")] = 40,
    system_tokens: Annotated[int, typer.Option(min=0, help="Approximate system prompt length.")] = 300,
    ignore_eos: Annotated[bool, typer.Option(help="Run every reply to --reply-tokens.")] = True,
    baseline: Annotated[bool, typer.Option(help="Also measure the re-prefill baseline.")] = True,
    stagger: Annotated[float, typer.Option(min=0.0, help="Seconds between session starts.")] = 0.5,
    kv_mib: Annotated[int | None, typer.Option(help="KV pool MiB (default: sized to the workload).")] = None,
    single_sessions: Annotated[int, typer.Option(
        min=1, help="Conversations of the 1-session level, one turn at a time (TTFT per turn is their median).")] = 3,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Multi-turn sessions on the LLM engine vs. transformers generate re-sending the whole conversation."""
    from voicepipe.llm.bench import run_llm_bench

    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
    except ValueError:
        raise VoicepipeError(f"--concurrency {concurrency!r} is not a list of integers.",
                             "write e.g. 1,4,16.") from None
    settings = settings_with(device__device=device)
    report = run_llm_bench(settings, turns=turns, concurrency=levels, reply_tokens=reply_tokens,
                           system_tokens=system_tokens, ignore_eos=ignore_eos, baseline=baseline, stagger_s=stagger,
                           kv_cache_mib=kv_mib, single_sessions=single_sessions,
                           progress=lambda line: err_console.print(line, highlight=False))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table(title=f"LLM engine: {turns} turns, {reply_tokens}-token replies")
    for column in ("sessions", "tok/s", "TTFT p50", "TTFT p95", "ITL p50", "cached from turn 2"):
        table.add_column(column)
    for c, lvl in report["levels"].items():
        cached = [f for f in lvl["cached_fraction_per_turn"][1:] if f is not None]
        table.add_row(c, f"{lvl['output_tokens_per_s']:.1f}", f"{lvl['ttft_p50']:.3f}", f"{lvl['ttft_p95']:.3f}",
                      f"{lvl['itl_p50']:.3f}", f"{min(cached):.3f}" if cached else "-")
    if "baseline" in report:
        base = report["baseline"]
        table.add_row("baseline", f"{base['tokens_per_s']:.1f}", f"{statistics.median(base['ttft_per_turn']):.3f}",
                      "-", "-", "0")
    console.print(table)
    for key, value in report["ratios"].items():
        console.print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


@bench_app.command("decode")
def bench_decode(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    max_tokens: Annotated[int, typer.Option(min=2, help="Reply tokens at most (replies end at EOS).")] = 64,
    sessions: Annotated[int, typer.Option(min=2, help="Concurrent requests of the throughput level.")] = 16,
    prompts: Annotated[int, typer.Option(min=1, max=8, help="Single-stream prompts.")] = 8,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Decode speed: transformers generate, today's engine path, the decoder in fp32 and int8, int8 + speculation."""
    from voicepipe.llm.bench_decode import run_decode_bench

    report = run_decode_bench(settings_with(device__device=device), max_tokens=max_tokens, sessions=sessions,
                              prompts=prompts, progress=lambda line: err_console.print(line, highlight=False))
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("configuration", "1 stream tok/s", f"{sessions} sessions tok/s", "overhead ms/step",
                  "forward ms/step", "same tokens as fp32", title="LLM decode")
    for name, row in report["single"].items():
        multi = report["sessions"].get(name, {})
        profile = row.get("profile", {})
        table.add_row(name, str(row["tok_s"]), str(multi.get("tok_s", "-")), str(profile.get("overhead", "-")),
                      str(profile.get("forward", "-")), str(row.get("same_tokens_as_fp32", "-")))
    console.print(table)
    for key in ("speedup_best_over_fp32", "throughput_16_best_over_fp32", "spec_acceptance_rate",
                "step_overhead_ms"):
        console.print(f"{key}: {report[key]}")


@bench_app.command("tiers")
def bench_tiers(
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the full report here.")] = None,
    turns: Annotated[int, typer.Option(min=2, help="Voice-like turns measured per phase.")] = 24,
    flex: Annotated[int, typer.Option(min=1, help="Concurrent flex requests.")] = 8,
    flex_tokens: Annotated[int, typer.Option(min=1, help="Tokens each flex request generates.")] = 256,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
) -> None:
    """Priority and default voice turns under flex load vs. the same turns on an idle engine."""
    import asyncio

    from voicepipe.llm.bench_tiers import run_tiers_bench
    from voicepipe.llm.engine import LLMEngine
    from voicepipe.llm.loader import load_default_llm

    settings = settings_with(device__device=device)
    model, tokenizer = load_default_llm(settings)
    engine = LLMEngine(model, tokenizer, settings.llm)
    engine.start()
    try:
        report = asyncio.run(run_tiers_bench(engine, n_turns=turns, n_flex=flex, flex_tokens=flex_tokens))
    finally:
        engine.stop()
    if json_file is not None:
        json_file.write_text(json.dumps(report, indent=2))
    table = Table("voice turns", "TTFT p50 ms", "TTFT p95 ms", title="TTFT of voice-like turns")
    for name, row in report["ttft_ms"].items():
        table.add_row(name, f"{row['p50']:.1f}", f"{row['p95']:.1f}")
    console.print(table)
    console.print(f"flex tokens/s kept under priority load: {report['flex_tokens_per_s']:.1f}")
    for key, value in report["ratios"].items():
        console.print(f"{key}: {value:.3f}")


def run() -> None:
    """Console-script entry point: one clear line for expected errors, a traceback only with --debug."""
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(n) comes back as n here
    except VoicepipeError as exc:
        if state.debug:
            raise
        err_console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except TyperException as exc:  # a usage error (typer's own copy of click raises these): its message, no traceback
        exc.show()
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    run()
