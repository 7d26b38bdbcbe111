"""Backchannels: what a listener says to show they follow ("mm-hm", "yeah", "right", "okay"), not to take the turn.

While the agent speaks, caller speech made only of these words keeps the agent talking; anything else ("wait",
"stop", "no", a real sentence) interrupts it. Decided on the words the STT heard, not on the speech's length.
"""

from __future__ import annotations

import re

# Each entry is a whole backchannel, as normalised by `normalise` (lower case, no punctuation, single spaces).
BACKCHANNELS = frozenset({
    "mm", "mhm", "mm hm", "mm hmm", "mmhmm", "hmm", "uh huh", "uh hum", "um hum", "aha", "ah", "oh",
    "yeah", "yea", "yes", "yep", "yup", "ya", "right", "alright", "all right", "okay", "ok", "o k", "kay",
    "sure", "i see", "got it", "cool", "nice", "great", "good", "fine", "exactly", "true", "indeed", "wow",
    "oh okay", "oh right", "oh yeah", "yeah yeah", "right right", "okay okay", "yes yes", "uh huh uh huh",
    "mm hmm yeah", "yeah okay", "okay yeah", "yeah right", "right okay", "okay right", "i see okay",
})
# Words that always take the turn, even beside a backchannel ("yeah wait", "okay stop").
INTERRUPTIONS = frozenset({"wait", "stop", "no", "hold", "hang", "sorry", "excuse", "actually", "but", "what",
                           "pardon", "nope", "repeat"})
MAX_WORDS = 4  # longer speech is a sentence, whatever its words


def normalise(text: str) -> str:
    """Lower case, hyphens and punctuation to spaces, single spaces: "Mm-hmm." -> "mm hmm"."""
    return " ".join(re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).replace("'", "").split())


def is_backchannel(text: str) -> bool:
    """True when `text` (what the caller said over the agent) is only a backchannel; "" (no words) is not."""
    words = normalise(text)
    if not words or len(words.split()) > MAX_WORDS or INTERRUPTIONS & set(words.split()):
        return False
    return words in BACKCHANNELS or all(w in BACKCHANNELS for w in words.split())
