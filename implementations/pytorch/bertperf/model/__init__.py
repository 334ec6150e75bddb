"""BERT for MLPerf pretraining: the unpadded/packed model, its padded reference, inputs and name
maps."""

from bertperf.model.batch import (BatchCounts, PackedBatch, PaddedBatch, UnpaddedBatch, pad,
                                  unpack_rows, unpad)
from bertperf.model.bert import (BertForPreTraining, PreTrainingOutput, compiled_forward_loss,
                                 forward_loss)
from bertperf.model.bert_config import BertConfig
from bertperf.model.hf import from_hf_state_dict, tf_name, tf_transposed, to_hf_state_dict
from bertperf.model.padded import PaddedBertForPreTraining

__all__ = ["BatchCounts", "BertConfig", "BertForPreTraining", "PackedBatch", "PaddedBatch",
           "PaddedBertForPreTraining", "PreTrainingOutput", "UnpaddedBatch", "from_hf_state_dict",
           "compiled_forward_loss", "forward_loss", "pad", "tf_name", "tf_transposed",
           "to_hf_state_dict", "unpack_rows", "unpad"]
