"""The model's "fused" operations: what each computes (a plain PyTorch reference) and the
implementation the model calls, tested against the reference forward and backward."""

from bertperf.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from bertperf.kernels.dropout_add_layer_norm import (dropout_add_layer_norm,
                                                     dropout_add_layer_norm_reference)
from bertperf.kernels.varlen_attention import (flash_supported, varlen_attention,
                                               varlen_attention_flash, varlen_attention_padded,
                                               varlen_attention_reference)

__all__ = ["bias_gelu", "bias_gelu_reference", "dropout_add_layer_norm",
           "dropout_add_layer_norm_reference", "flash_supported", "varlen_attention",
           "varlen_attention_flash", "varlen_attention_padded", "varlen_attention_reference"]
