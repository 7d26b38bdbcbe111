"""`voicepipe bench decode`'s arithmetic: the step profile per step and the issue's flat keys."""

from voicepipe.llm.bench_decode import CONFIGS, profile_per_step, summarize


def test_the_profile_is_milliseconds_per_step_and_the_overhead_is_everything_but_the_forward() -> None:
    before = {"steps": 10, "decode_rows": 10, "schedule": 0.0, "propose": 0.0, "inputs": 0.0, "forward": 1.0,
              "sample": 0.0, "bookkeeping": 0.0}
    after = {"steps": 30, "decode_rows": 50, "schedule": 0.02, "propose": 0.01, "inputs": 0.04, "forward": 1.6,
             "sample": 0.02, "bookkeeping": 0.01}
    profile = profile_per_step(before, after)
    assert profile["forward"] == 30.0 and profile["schedule"] == 1.0 and profile["inputs"] == 2.0
    assert profile["overhead"] == 1.0 + 0.5 + 2.0 + 1.0 + 0.5
    assert profile["steps"] == 20 and profile["rows_per_step"] == 2.0
    assert profile_per_step(after, after) == {}


TOK_S = {"fp32": 12.0, "fp32_decoder": 15.0, "q4": 70.0, "q4_spec": 65.0, "fp16": 30.0, "fp16_spec": 40.0,
         "int8": 50.0, "int8_spec": 60.0}


def report(auto: str) -> dict:
    single = {name: {"tok_s": TOK_S[name], "acceptance_rate": 0.5 if name.endswith("_spec") else None,
                     "profile": {"overhead": 3.0}} for name in CONFIGS}
    single["baseline"] = {"tok_s": 10.0}
    sessions = {name: {"tok_s": 4 * value} for name, value in TOK_S.items()} | {"baseline": {"tok_s": 20.0}}
    return {"workload": {"auto_weights": auto}, "single": single, "sessions": sessions}


def test_the_best_engine_is_the_faster_of_autos_format_with_and_without_speculation() -> None:
    flat = summarize(report("fp16"))
    assert flat["engine_best"] == "fp16_spec"  # int8 is faster, but auto did not pick it: it failed the bound
    assert flat["speedup_best_over_fp32"] == round(40 / 12, 3)
    assert flat["throughput_16_best_over_fp32"] == round(160 / 48, 3)
    assert flat["spec_acceptance_rate"] == 0.5 and flat["step_overhead_ms"] == 3.0
    assert summarize(report("int8"))["engine_best"] == "int8_spec"
    assert summarize(report("q4"))["engine_best"] == "q4"  # speculation slower here: the plain path is best


def test_llama_cpp_is_compared_only_when_it_ran() -> None:
    run = report("q4")
    assert "llamacpp_tok_s" not in summarize(run) and "best_over_llamacpp" not in summarize(run)
    run["single"]["llamacpp"] = {"tok_s": 140.0, "gguf": "model.gguf", "threads": 2}
    flat = summarize(run)
    assert flat["llamacpp_tok_s"] == 140.0 and flat["best_over_llamacpp"] == 0.5
