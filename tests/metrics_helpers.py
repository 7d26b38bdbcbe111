"""Read the app's /metrics in tests: `Scrape(text).value("voicepipe_llm_ttft_seconds_count", tier="flex")`.

Take one scrape before and one after what a test does, and compare values: every figure is cumulative.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# the samples a family of each type exposes, whether or not it has any yet
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


class Scrape:
    def __init__(self, text: str) -> None:
        self.families = {family.name: family for family in text_string_to_metric_families(text)}

    def value(self, sample: str, **labels: str) -> float:
        """The sum of the samples named ``sample`` whose labels include ``labels`` (0 when there is none)."""
        return sum(s.value for s in self.samples(sample, **labels))

    def samples(self, sample: str, **labels: str) -> list:
        return [s for family in self.families.values() for s in family.samples
                if s.name == sample and labels.items() <= s.labels.items()]

    def names(self) -> set[str]:
        """Every sample name the exposition declares: what a PromQL query can select."""
        return {family.name + suffix for family in self.families.values()
                for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}

    def label_names(self, sample: str) -> set[str]:
        """The label names seen on the samples named ``sample`` (histogram buckets' ``le`` included)."""
        return {key for s in self.samples(sample) for key in s.labels}

    def bucket(self, histogram: str, le: float, **labels: str) -> float:
        """The cumulative count of ``histogram``'s bucket whose upper bound is ``le``."""
        return sum(s.value for s in self.samples(histogram + "_bucket", **labels) if float(s.labels["le"]) == le)


class StatsOnly:
    """Stands in for the LLM engine in model-free tests: only its ``stats()``, which the live collector reads (the
    real engine's come through in tests/e2e/test_metrics.py)."""

    def __init__(self, **stats) -> None:
        self._stats = {"blocks_used": 10, "blocks_free": 54, "blocks_total": 64, "sessions_pinned": 2, "sessions": 3,
                       "waiting": 1, "running": 2, "prompt_tokens": 900, "cached_prompt_tokens": 600,
                       "compactions": 1, "unpinned_sessions": 4, "output_tokens": 77, "errors": 5, "overloaded": 2,
                       "preemptions_by_tier": {"flex": 3, "default": 1}, "draft_tokens": 40, "accepted_tokens": 25,
                       **stats}

    def stats(self) -> dict:
        return self._stats
