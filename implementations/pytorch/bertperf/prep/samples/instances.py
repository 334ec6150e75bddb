"""The reference's pretraining-instance algorithm, on token ids, in plain Python.

This is the readable statement of `create_training_instances` from the MLCommons reference
`create_pretraining_data.py` (see docs/data_format.md and docs/design.md, "Data preparation"),
and the oracle that the C fast path (`_fastcreate.c`) is tested against. Both consume the random
stream of one `random.Random(seed)` in exactly the reference's order, so for the same documents
they give the same instances, masks, NSP labels and output order as the reference.

Tokens are vocabulary ids: the reference's `vocab_words[i]` is id i, and its tokens "[CLS]"/"[SEP]"
can only come from the ids it inserts (the basic tokenizer splits "[" off any literal "[CLS]").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bertperf.errors import UserError
from bertperf.formats.samples import Samples, offsets_from_lengths


@dataclass(frozen=True)
class Params:
    """The reference's instance-creation flags (MLPerf values in brackets)."""

    max_seq_length: int = 128  # [512] hard limit on tokens per instance, [CLS] and both [SEP] included
    max_predictions_per_seq: int = 20  # [76] cap on masked positions per instance
    masked_lm_prob: float = 0.15  # [0.15] fraction of tokens to mask (rounded half to even)
    dupe_factor: int = 10  # [10] passes over the documents, each with new random choices
    short_seq_prob: float = 0.1  # [0.1] chance that a document pass targets a random shorter length
    random_seed: int = 12345  # [12345] seed of the single random.Random the whole file uses

    def check(self) -> None:
        if self.max_seq_length < 5:
            raise UserError(f"--max_seq_length={self.max_seq_length}: must be at least 5 "
                            "([CLS] A [SEP] B [SEP] needs one token each in A and B)")
        if self.max_predictions_per_seq < 1:
            raise UserError(f"--max_predictions_per_seq={self.max_predictions_per_seq}: must be "
                            "at least 1 (every sample masks at least one token)")
        if self.dupe_factor < 0:
            raise UserError(f"--dupe_factor={self.dupe_factor}: must not be negative")
        if not (0.0 <= self.masked_lm_prob <= 1.0 and 0.0 <= self.short_seq_prob <= 1.0):
            raise UserError("--masked_lm_prob and --short_seq_prob must lie in [0, 1]")


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    vocab_size: int


@dataclass
class Documents:
    """Tokenized documents, flat: sentence s is tokens[sent_offsets[s]:sent_offsets[s+1]], document d
    is sentences doc_offsets[d]..doc_offsets[d+1]-1. No document and no sentence is empty."""

    tokens: np.ndarray  # int32
    sent_offsets: np.ndarray  # int64, n_sentences + 1
    doc_offsets: np.ndarray  # int64, n_documents + 1

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def as_lists(self) -> list[list[list[int]]]:
        toks, so = self.tokens.tolist(), self.sent_offsets.tolist()
        return [[toks[so[s]:so[s + 1]] for s in range(d0, d1)]
                for d0, d1 in zip(self.doc_offsets[:-1].tolist(), self.doc_offsets[1:].tolist())]


@dataclass
class Instances:
    """The samples in creation order, and the order the reference writes them in (its final
    `rng.shuffle(instances)`, applied to indices)."""

    samples: Samples
    order: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.samples)


def create_instances(docs: Documents, params: Params, ids: SpecialIds,
                     rng: random.Random) -> Instances:
    """Shuffle the documents, make `dupe_factor` passes of instances, shuffle the instances."""
    all_documents = docs.as_lists()
    rng.shuffle(all_documents)
    out = _Builder()
    for _ in range(params.dupe_factor):
        for document_index in range(len(all_documents)):
            _instances_from_document(all_documents, document_index, params, ids, rng, out)
    order = list(range(len(out.lengths)))
    rng.shuffle(order)  # the permutation rng.shuffle(instances) applies depends only on the length
    return out.finish(order)


class _Builder:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.lengths: list[int] = []
        self.b_starts: list[int] = []
        self.nsp: list[int] = []
        self.mlm_positions: list[int] = []
        self.mlm_labels: list[int] = []
        self.mlm_counts: list[int] = []

    def add(self, tokens: list[int], a_length: int, is_random_next: bool,
            positions: list[int], labels: list[int]) -> None:
        self.tokens.extend(tokens)
        self.lengths.append(len(tokens))
        self.b_starts.append(a_length + 2)  # after [CLS] A [SEP]
        self.nsp.append(int(is_random_next))
        self.mlm_positions.extend(positions)
        self.mlm_labels.extend(labels)
        self.mlm_counts.append(len(positions))

    def finish(self, order: list[int]) -> Instances:
        samples = Samples(
            input_ids=np.asarray(self.tokens, dtype=np.int32),
            offsets=offsets_from_lengths(np.asarray(self.lengths, dtype=np.int64)),
            b_starts=np.asarray(self.b_starts, dtype=np.int32),
            mlm_positions=np.asarray(self.mlm_positions, dtype=np.int32),
            mlm_ids=np.asarray(self.mlm_labels, dtype=np.int32),
            mlm_offsets=offsets_from_lengths(np.asarray(self.mlm_counts, dtype=np.int64)),
            nsp=np.asarray(self.nsp, dtype=np.int8),
        )
        return Instances(samples, np.asarray(order, dtype=np.int64))


def _instances_from_document(all_documents: list[list[list[int]]], document_index: int,
                             params: Params, ids: SpecialIds, rng: random.Random,
                             out: _Builder) -> None:
    document = all_documents[document_index]
    max_num_tokens = params.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < params.short_seq_prob:  # drawn once per document and pass
        target_seq_length = rng.randint(2, max_num_tokens)

    chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for seg in chunk[:a_end] for t in seg]
            tokens_b: list[int] = []
            # `or` short-circuits: no draw when the chunk has a single sentence
            is_random_next = len(chunk) == 1 or rng.random() < 0.5
            if is_random_next:
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):
                    random_document_index = rng.randint(0, len(all_documents) - 1)
                    if random_document_index != document_index:
                        break
                random_document = all_documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                for j in range(random_start, len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # put the unused sentences back
            else:
                tokens_b = [t for seg in chunk[a_end:] for t in seg]
            _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            tokens = [ids.cls, *tokens_a, ids.sep, *tokens_b, ids.sep]
            positions, labels = _mask(tokens, len(tokens_a), params, ids, rng)
            out.add(tokens, len(tokens_a), is_random_next, positions, labels)
            chunk = []
            current_length = 0
        i += 1


def _truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                       rng: random.Random) -> None:
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b  # ties: B
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _mask(tokens: list[int], a_length: int, params: Params, ids: SpecialIds,
          rng: random.Random) -> tuple[list[int], list[int]]:
    """Mask tokens in place; return ascending positions and the original ids there."""
    n = len(tokens)
    cand = [k for k in range(1, n - 1) if k != a_length + 1]  # all but [CLS] and the two [SEP]
    rng.shuffle(cand)
    # Python 3 round() rounds half to even: it matters at 13 lengths (30, 70, ..., 510 at 0.15)
    num_to_predict = min(params.max_predictions_per_seq,
                         max(1, int(round(n * params.masked_lm_prob))))
    picked = []
    for index in cand[:num_to_predict]:
        original = tokens[index]
        if rng.random() < 0.8:
            tokens[index] = ids.mask
        elif rng.random() < 0.5:
            pass  # keep the original token
        else:
            tokens[index] = rng.randint(0, ids.vocab_size - 1)
        picked.append((index, original))
    picked.sort()
    return [p for p, _ in picked], [lab for _, lab in picked]
