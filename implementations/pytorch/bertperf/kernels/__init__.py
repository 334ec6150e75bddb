"""The model's fused operations: what each computes (a plain PyTorch reference) and the
implementation the model and optimizer call, tested against the reference forward and
backward. On CUDA tensors with Triton installed the implementations run Triton kernels
(bertperf.kernels.triton, imported on first use), elsewhere plain PyTorch, as the `Kernels`
value each call is given says (FUSED_KERNELS; default: auto)."""

from bertperf.kernels.backend import Kernels
from bertperf.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from bertperf.kernels.bias_gelu_layer_norm import (bias_gelu_layer_norm,
                                                   bias_gelu_layer_norm_reference)
from bertperf.kernels.cross_entropy import cross_entropy_sum, cross_entropy_sum_reference
from bertperf.kernels.dropout_add_layer_norm import (dropout_add_layer_norm,
                                                     dropout_add_layer_norm_reference)
from bertperf.kernels.embedding_layer_norm import (embedding_layer_norm,
                                                   embedding_layer_norm_reference)
from bertperf.kernels.lamb import LambLayout, lamb_step, lamb_step_reference
from bertperf.kernels.layer_norm import dropout_keep_mask, layer_norm_reference
from bertperf.kernels.varlen_attention import (flash_supported, varlen_attention,
                                               varlen_attention_flash, varlen_attention_padded,
                                               varlen_attention_reference)

__all__ = ["Kernels", "LambLayout", "bias_gelu", "bias_gelu_layer_norm",
           "bias_gelu_layer_norm_reference", "bias_gelu_reference", "cross_entropy_sum",
           "cross_entropy_sum_reference", "dropout_add_layer_norm",
           "dropout_add_layer_norm_reference", "dropout_keep_mask", "embedding_layer_norm",
           "embedding_layer_norm_reference", "flash_supported", "lamb_step",
           "lamb_step_reference", "layer_norm_reference", "varlen_attention",
           "varlen_attention_flash", "varlen_attention_padded", "varlen_attention_reference"]
