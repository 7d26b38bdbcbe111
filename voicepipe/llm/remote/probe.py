"""The end probe over a remote server: P(the caller's words end where they stop), the text evidence of the
end-of-turn policy, asked of an OpenAI-compatible server that serves the legacy completions API with `logprobs`
(vLLM, SGLang, llama.cpp's server, voicepipe's /v1).

The in-process engine reads that probability off the turn's own prefill (`intake._probe_index`). A chat request
gives no logits of the user's turn, so the probe is a second request: the conversation rendered with the remote
model's chat template (`llm.tokenizer`: that model's tokenizer, here), cut right after the caller's words (their
trailing punctuation left out, as the engine does), sent to `/completions` with ``max_tokens: 1`` and
``logprobs: 20``. P(end) is the summed probability of the end tokens among those 20: the template's end-of-message
token and ". ? !" (the same tokens the engine sums over; one that is not among the 20 likeliest adds less than
1/20 and is left out). The history is the same bytes as the chat request's, so the server's prefix cache serves
the probe's prompt too. A probe that fails is logged and resolves to None: the policy goes on without the words.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx

from voicepipe.llm.chat import ChatRenderer
from voicepipe.llm.intake import END_PUNCTUATION

log = logging.getLogger(__name__)

TOP_LOGPROBS = 20
END_MARKS = (".", "?", "!")


class EndProbe:
    def __init__(self, tokenizer) -> None:
        self.renderer = ChatRenderer(tokenizer)
        self.end_texts = frozenset({*END_MARKS, self._end_of_message(tokenizer)} - {""})

    def _end_of_message(self, tokenizer) -> str:
        """The text of the token that follows a user message's content in the chat template."""
        text = self.renderer.render([{"role": "user", "content": "x"}], add_generation_prompt=False)
        after = self.renderer.encode(text[text.rindex("x") + 1:])
        return tokenizer.decode(after[:1], skip_special_tokens=False) if after else ""

    def prompt(self, messages: list[dict[str, str]]) -> str | None:
        """The conversation's text up to the last user message's words; None when there are no words."""
        content = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        words = content.rstrip(END_PUNCTUATION)
        if not words:
            return None
        text = self.renderer.render(messages, add_generation_prompt=True)
        at = text.rfind(content)
        return text[:at + len(words)] if at >= 0 else None

    def end_prob(self, top_logprobs: dict[str, float]) -> float:
        return sum(math.exp(lp) for text, lp in top_logprobs.items() if text in self.end_texts)

    async def ask(self, client: httpx.AsyncClient, url: str, model: str, prompt: str,
                  headers: dict[str, str], user: str) -> float | None:
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "logprobs": TOP_LOGPROBS,
                "user": user}
        try:
            response = await client.post(f"{url}/completions", json=body, headers=headers)
            response.raise_for_status()
            top = _first_top_logprobs(response.json())
        except Exception as exc:
            log.warning("end probe at %s failed (%s: %s); this pause goes on without the words", url,
                        type(exc).__name__, exc)
            return None
        return self.end_prob(top)


def _first_top_logprobs(body: Any) -> dict[str, float]:
    top = body["choices"][0]["logprobs"]["top_logprobs"][0]
    if not isinstance(top, dict):
        raise ValueError("the server sent no top_logprobs")
    return {str(k): float(v) for k, v in top.items()}
