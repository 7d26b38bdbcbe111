"""The three reports of a replay run: report.json, junit.xml (for CI) and summary.md (one row per case and turn,
failures first, expected against actual)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from voicepipe.replay.checks import Check
from voicepipe.replay.results import CaseResult


def write_reports(report: dict[str, Any], results: list[CaseResult], directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"json": directory / "report.json", "junit": directory / "junit.xml", "markdown": directory / "summary.md"}
    paths["json"].write_text(json.dumps(report, indent=2))
    paths["junit"].write_text(junit_xml(results, report["wall_s"]))
    paths["markdown"].write_text(markdown_summary(report, results))
    return paths


def junit_xml(results: list[CaseResult], wall_s: float) -> str:
    suite = ET.Element("testsuite", name="voicepipe replay", tests=str(len(results)),
                       failures=str(sum(not r.passed for r in results)), errors="0", time=f"{wall_s:.2f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"replay.{r.transport}", name=r.name,
                             time=f"{r.call.wall_s:.2f}")
        failed = [c for c in r.checks if not c.passed]
        if failed:
            failure = ET.SubElement(case, "failure", message=f"{len(failed)} of {len(r.checks)} checks failed",
                                    type="ExpectationFailed")
            failure.text = "\n".join(_line(c) for c in failed)
        ET.SubElement(case, "system-out").text = "\n".join(_line(c) for c in r.checks)
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _line(c: Check) -> str:
    where = "call" if c.turn is None else f"turn {c.turn}"
    return f"[{'ok' if c.passed else 'FAIL'}] {where} {c.name}: expected {c.expected}, got {c.actual}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rows(results: list[CaseResult]) -> list[tuple[bool, str, str, str, str, str, str]]:
    """(passed, case, turn, checks, expected, actual, agent reply) per case and turn; failures first, then in run
    order."""
    out = []
    for r in results:
        replies = {t.turn: f"{t.heard_text or '(nothing heard)'} [cut]" if t.interrupted else t.agent_text
                   for t in r.call.turns}
        turns = sorted({c.turn for c in r.checks if c.turn is not None})
        for turn in [None, *turns]:
            checks = [c for c in r.checks if c.turn == turn]
            if not checks:
                continue
            failed = [c for c in checks if not c.passed]
            shown = failed or [next((c for c in checks if c.name in ("transcript", "turns")), checks[0])]
            out.append((not failed, r.name, "call" if turn is None else str(turn),
                        "<br>".join(c.name for c in shown), "<br>".join(_cell(c.expected) for c in shown),
                        "<br>".join(_cell(c.actual) for c in shown), _cell(replies.get(turn, "")) if turn else ""))
    return sorted(out, key=lambda row: row[0])  # stable: failures first


def markdown_summary(report: dict[str, Any], results: list[CaseResult]) -> str:
    lag = report.get("send_lag_p95_ms")
    lines = [f"# voicepipe replay: {report['cases_passed']} passed, {report['cases_failed']} failed",
             "", f"{len(results)} cases in {report['wall_s']:.1f} s; caller audio send lag p95 "
             f"{'-' if lag is None else f'{lag:.1f} ms'} (the replay's own timing error).", "",
             "| result | case | turn | checks | expected | actual | agent said |", "|---|---|---|---|---|---|---|"]
    for passed, case, turn, names, expected, actual, reply in rows(results):
        lines.append(f"| {'pass' if passed else '**FAIL**'} | {case} | {turn} | {names} | {expected} | {actual} "
                     f"| {reply} |")
    return "\n".join(lines + repeat_lines(results)) + "\n"


def repeat_lines(results: list[CaseResult]) -> list[str]:
    """With --repeat: per case, whether every run was the same, and the spread of voice-to-voice."""
    repeated = [r for r in results if r.repeat is not None]
    if not repeated:
        return []
    lines = ["", f"## {repeated[0].repeat['runs']} runs of each case", "",
             "| case | the same in every run | runs that passed | voice-to-voice min / median / max (ms) |",
             "|---|---|---|---|"]
    for r in repeated:
        rep, v2v = r.repeat, r.repeat["voice_to_voice_ms"]
        n = len(rep["differences"])
        same = "yes" if rep["same"] else f"**no**: {n} difference{'s' * (n != 1)}"
        lines.append(f"| {r.name} | {same} | {rep['runs_passed']}/{rep['runs']} | "
                     f"{' / '.join('-' if v2v[k] is None else f'{v2v[k]:g}' for k in ('min', 'median', 'max'))} |")
    return lines
