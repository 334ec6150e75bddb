"""The padded reference: BERT pretraining on [B, L] rows with an attention mask, written with
plain PyTorch operations only (no bertperf.kernels), on the same parameters as the unpadded model.
It exists to test BertForPreTraining against: same weights and sequences give the same logits,
losses and gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertperf.model.bert import (BertForPreTraining, PreTrainingOutput, pretraining_output,
                                 summed_cross_entropy)
from bertperf.model.layers import BertLayer


class PaddedBertForPreTraining(BertForPreTraining):
    """BertForPreTraining's parameters (same names, same state dict) with a padded forward."""

    def _dropout(self, x: torch.Tensor, p: float) -> torch.Tensor:
        return F.dropout(x, p, self.training)

    def _layer_norm(self, x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, self.config.layer_norm_eps)

    def _layer(self, layer: BertLayer, h: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        c = self.config
        B, L, _ = h.shape
        sa = layer.attention.self

        def heads(weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:  # [B, heads, L, hs]
            return F.linear(h, weight, bias).view(B, L, c.num_attention_heads, -1).transpose(1, 2)

        q, k, v = map(heads, sa.qkv.weight.chunk(3), sa.qkv.bias.chunk(3))  # 3 separate GEMMs
        scores = q @ k.transpose(-1, -2) / c.head_size ** 0.5
        scores = scores.masked_fill(~key_mask, float("-inf"))
        probs = self._dropout(torch.softmax(scores, dim=-1), c.attention_probs_dropout_prob)
        ctx = (probs @ v).transpose(1, 2).reshape(B, L, c.hidden_size)
        out = layer.attention.output
        h = self._layer_norm(self._dropout(out.dense(ctx), c.hidden_dropout_prob) + h,
                             out.LayerNorm)
        mid = F.gelu(layer.intermediate.dense(h))
        out = layer.output
        return self._layer_norm(self._dropout(out.dense(mid), c.hidden_dropout_prob) + h,
                                out.LayerNorm)

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor,
                segment_ids: torch.Tensor, masked_lm_positions: torch.Tensor,
                masked_lm_ids: torch.Tensor | None = None,
                next_sentence_labels: torch.Tensor | None = None) -> PreTrainingOutput:
        """A PaddedBatch's fields ([B, L] rows, [B, P] 0-padded masks, [B] NSP labels). The MLM
        head runs on every position, then the logits at the real masked positions are taken,
        row by row (the unpadded model's order)."""
        c = self.config
        B, L = input_ids.shape
        emb = self.bert.embeddings
        positions = torch.arange(L, device=input_ids.device)
        h = (emb.word_embeddings.weight[input_ids] + emb.position_embeddings.weight[positions]
             + emb.token_type_embeddings.weight[segment_ids])
        h = self._dropout(self._layer_norm(h, emb.LayerNorm), c.hidden_dropout_prob)
        key_mask = input_mask.bool()[:, None, None, :]
        for layer in self.bert.encoder.layer:
            h = self._layer(layer, h, key_mask)

        t = self.cls.predictions.transform
        mlm = self._layer_norm(F.gelu(t.dense(h)), t.LayerNorm)
        mlm = F.linear(mlm, emb.word_embeddings.weight, self.cls.predictions.bias)
        real = masked_lm_positions != 0
        rows = torch.arange(B, device=input_ids.device)[:, None].expand_as(masked_lm_positions)
        mlm_logits = mlm[rows[real], masked_lm_positions[real]][:, :c.vocab_size]
        pooled = torch.tanh(self.bert.pooler.dense(h[:, 0]))
        nsp_logits = self.cls.seq_relationship(pooled)
        labels = None if masked_lm_ids is None else masked_lm_ids[real]
        return pretraining_output(mlm_logits, nsp_logits, labels, next_sentence_labels,
                                  mlm_cross_entropy=summed_cross_entropy)
