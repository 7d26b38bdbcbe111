"""turns room: the end-of-turn policy and the evidence it weighs (see docs)."""
