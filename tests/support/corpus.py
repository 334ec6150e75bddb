"""The synthetic corpus of data_prep_facts.md §A1.6 and the digests the reference comparisons use:
canonical_digest (§A1.6's serialisation of the samples, from padded HDF5 arrays) and
padded_digest (the padded rows exactly as written)."""

from __future__ import annotations

import hashlib
import re

import numpy as np


def synthetic_corpus(vocab_words: list[str]) -> str:
    """The 60-document corpus of data_prep_facts.md §A1.6 (53,417 bytes, md5 59d61d0c...)."""
    words = [w for w in vocab_words[1996:] if re.fullmatch("[a-z]+", w)]
    docs = []
    for d in range(60):
        sents = []
        for s in range(1 + (7 * d) % 9):
            n = 3 + ((31 * d + 17 * s) % 40)
            sents.append(" ".join(words[(1009 * d + 101 * s + 7 * k) % len(words)]
                                  for k in range(n)) + " .")
        docs.append("\n".join(sents))
    return "\n\n".join(docs) + "\n"


def canonical_digest(arrays: dict[str, np.ndarray], vocab_words: list[str]) -> str:
    """md5 of the canonical serialisation of §A1.6, computed from padded HDF5 arrays."""
    lines = []
    for i in range(len(arrays["next_sentence_labels"])):
        n = int(arrays["input_mask"][i].sum())
        m = int((arrays["masked_lm_positions"][i] != 0).sum())
        lines.append("|".join([
            " ".join(vocab_words[t] for t in arrays["input_ids"][i][:n]),
            " ".join(str(int(s)) for s in arrays["segment_ids"][i][:n]),
            str(int(arrays["next_sentence_labels"][i])),
            " ".join(str(int(p)) for p in arrays["masked_lm_positions"][i][:m]),
            " ".join(vocab_words[t] for t in arrays["masked_lm_ids"][i][:m]),
        ]))
    return hashlib.md5("\n".join(lines).encode()).hexdigest()


def padded_digest(arrays: dict[str, np.ndarray]) -> str:
    """md5 over the padded rows exactly as written (the digest used for reference comparisons)."""
    keys = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")
    lines = []
    for i in range(len(arrays["next_sentence_labels"])):
        rows = [arrays[k][i] for k in keys] + [[arrays["next_sentence_labels"][i]]]
        lines.append("|".join(" ".join(str(int(v)) for v in row) for row in rows))
    return hashlib.md5("\n".join(lines).encode()).hexdigest()
