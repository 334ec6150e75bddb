"""The BERT model's hyper-parameters, as in the MLPerf checkpoint's `bert_config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from bertperf.errors import UserError


ENCODER_LAYER = "bert.encoder.layer."
"""The start of the names of encoder layer i's parameters in BertForPreTraining's state dict:
ENCODER_LAYER, i, a dot, the rest."""


def layer_part(name: str) -> tuple[int, str] | None:
    """(the encoder layer, the rest of the name) of a BertForPreTraining parameter's name; None
    for one outside the encoder's layers."""
    if not name.startswith(ENCODER_LAYER):
        return None
    index, rest = name[len(ENCODER_LAYER):].split(".", 1)
    return int(index), rest


NAMED: dict[str, dict[str, int]] = {
    "large": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096),
    "base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, intermediate_size=3072),
    "tiny": dict(vocab_size=30522, hidden_size=128, num_hidden_layers=2,
                 num_attention_heads=2, intermediate_size=512),
}
"""The model shapes BERT_CONFIG can name: BERT-large as MLPerf's checkpoint, BERT-base, and a
2-layer BERT of width 128 for tests and the CPU demo (all with MLPerf's vocab)."""


@dataclass(frozen=True)
class BertConfig:
    """Sizes and regularisation of a BERT model (Google's `bert_config.json` keys, plus
    `layer_norm_eps` and `pad_vocab_to_multiple_of`, which that file does not have)."""

    vocab_size: int
    """Number of real token ids (30522 for MLPerf); the embedding table holds `padded_vocab_size`
    rows."""
    hidden_size: int
    """Width of every token's hidden state (1024 for BERT-large)."""
    num_hidden_layers: int
    """Number of transformer layers (24 for BERT-large)."""
    num_attention_heads: int
    """Attention heads per layer; must divide hidden_size (16 for BERT-large)."""
    intermediate_size: int
    """Width of the feed-forward layer (4096 for BERT-large)."""
    hidden_act: str = "gelu"
    """Feed-forward and MLM-transform activation; only "gelu" (exact, erf-based) is supported."""
    hidden_dropout_prob: float = 0.1
    """Dropout on the embeddings and on each sub-layer's output before the residual add."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Rows of the position-embedding table: the longest sequence the model takes."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids: A = 0, B = 1."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weight matrices and embeddings."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm (BERT's TF code uses 1e-12)."""
    pad_vocab_to_multiple_of: int = 8
    """The embedding table and MLM decoder are padded to a multiple of this (NVIDIA: 8, for
    tensor-core-friendly GEMMs); the padding rows never affect logits or loss. 1 = no padding."""

    def __post_init__(self) -> None:
        if self.hidden_act != "gelu":
            raise UserError(f"hidden_act {self.hidden_act!r} is not supported (only 'gelu')")
        if self.hidden_size % self.num_attention_heads:
            raise UserError(f"hidden_size {self.hidden_size} is not a multiple of "
                            f"num_attention_heads {self.num_attention_heads}")
        if self.pad_vocab_to_multiple_of < 1:
            raise UserError("pad_vocab_to_multiple_of must be at least 1")

    @property
    def padded_vocab_size(self) -> int:
        """vocab_size rounded up to a multiple of pad_vocab_to_multiple_of (30522 -> 30528)."""
        m = self.pad_vocab_to_multiple_of
        return -(-self.vocab_size // m) * m

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def large(cls) -> BertConfig:
        """BERT-large, exactly the MLPerf checkpoint's bert_config.json."""
        return cls(**NAMED["large"])

    @classmethod
    def named(cls, spec: str | Path) -> BertConfig:
        """A named shape (NAMED: "large", "base", "tiny") or the path of a bert_config.json."""
        if str(spec) in NAMED:
            return cls(**NAMED[str(spec)])
        if not Path(spec).is_file():
            raise UserError(f"BERT_CONFIG {str(spec)!r} is neither a named model shape "
                            f"({', '.join(NAMED)}) nor an existing bert_config.json")
        return cls.from_json(spec)

    @property
    def is_mlperf_large(self) -> bool:
        """Whether this is the benchmark's model (MLPerf's BERT-large sizes and vocab): the one
        the RCP table and the 0.34085 initial accuracy are about."""
        large = BertConfig.large()
        return (self.vocab_size, self.hidden_size, self.num_hidden_layers) == \
            (large.vocab_size, large.hidden_size, large.num_hidden_layers)

    @classmethod
    def from_json(cls, path: str | Path) -> BertConfig:
        """Read a bert_config.json (the MLPerf/Google format: a flat object of the fields above;
        fields it lacks keep their defaults). Unknown keys are an error."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: cannot read BERT config: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: BERT config is not a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"{path}: unknown BERT config keys {unknown}")
        try:
            return cls(**data)
        except TypeError as e:
            raise UserError(f"{path}: {e}") from None
