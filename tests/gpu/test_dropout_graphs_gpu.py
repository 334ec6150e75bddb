"""Dropout under CUDA-graph replay, what tests/gpu/test_packed_step_gpu.py leaves out (it turns
dropout off to compare losses): with USE_CUDA_GRAPH=1 and COMPILE=inductor on the packed batches
of tests/support/packed.py with dropout 0.1, every replay draws new masks (the seeds of the Triton
dropout kernels and the flash kernel's philox state come from the default CUDA generator, which a
replay advances), at eager's keep rate. Skipped without CUDA."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo

from bertperf.kernels import flash_supported, varlen_attention
from tests.support.attention import keep_mask_of
from tests.support.packed import L, packed_env, tiny_config, trainer_for  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

P = 0.1
CALLS = 5
"""Calls of a graphed function: CUDA graph trees run the first eagerly, record the second and
replay from the third."""
GRAPHED = {"USE_CUDA_GRAPH": "1", "COMPILE": "inductor"}


def cuda_trainer(env: dict, tmp_path, **extra: str):
    torch._dynamo.reset()
    return trainer_for(env, tmp_path, **{"DEVICE": "cuda", "PRECISION": "bf16",
                                         "GRADIENT_STEPS": "1", **extra})


def micro_step(trainer, micro) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's micro-step on `micro` with the weights as they are (no optimizer step): the
    loss and every gradient, flattened, copied out of the graphs' buffers."""
    plan = trainer.plan
    plan.optimizer.zero_grad(set_to_none=True)
    with trainer.autocast():
        loss = plan.forward_loss(plan.model, micro.inputs, micro.counts.clamp(min=1))
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in plan.core.parameters()])
    return loss.detach().clone(), grads.clone()


@pytest.mark.parametrize("switches", [{}, GRAPHED], ids=["eager", "cuda-graphs"])
def test_replays_of_one_batch_draw_new_masks(packed_env, tmp_path, switches):  # noqa: F811
    """The micro-step called CALLS times on one packed batch, the weights unchanged: with
    dropout 0.1 the last two calls (replays of the CUDA graphs) give different losses and
    gradients, as two eager calls do; with dropout 0 their losses are the same (the forward
    is deterministic: the difference is dropout's)."""
    for dropout in (P, 0.0):
        env = {**packed_env, "BERT_CONFIG": str(tiny_config(tmp_path / f"{dropout}.json",
                                                            dropout))}
        trainer = cuda_trainer(env, tmp_path, **switches)
        micro = next(trainer.batches)
        (loss_a, grad_a), (loss_b, grad_b) = [micro_step(trainer, micro)
                                              for _ in range(CALLS)][-2:]
        assert torch.isfinite(loss_a) and torch.isfinite(loss_b)
        if dropout:
            assert not torch.equal(loss_a, loss_b) and not torch.equal(grad_a, grad_b)
        else:
            assert torch.equal(loss_a, loss_b)


def graphed(fn):
    """fn compiled as the trainer compiles its micro-step with USE_CUDA_GRAPH=1 and
    COMPILE=inductor (model.bert.compiled_forward_loss): inductor's CUDA graphs, each call a new
    step of them."""
    compiled = torch.compile(fn, backend="inductor", mode="reduce-overhead", dynamic=False,
                             fullgraph=True)

    def replayed(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)
    return replayed


def keep_rates(masks: list[torch.Tensor], real: torch.Tensor) -> list[float]:
    return [m[real].double().mean().item() for m in masks]


def assert_rates(eager: float, replays: list[float], expected: float, n: int) -> None:
    """Eager's keep rate and each replay's within 5 standard errors of `expected` (n draws),
    and of each other."""
    se = math.sqrt(expected * (1 - expected) / n)
    assert abs(eager - expected) < 5 * se, (eager, expected, se)
    for rate in replays:
        assert abs(rate - expected) < 5 * se and abs(rate - eager) < 5 * math.sqrt(2) * se, \
            (rate, eager, se)


def test_triton_dropout_keep_rate_under_replay(packed_env, tmp_path):  # noqa: F811
    """The embeddings' Triton dropout (kernels.embedding_layer_norm: dropout after the
    LayerNorm, so an output is exactly 0 where dropped) on a packed batch of 32 rows: replays
    draw new masks, keeping 1 - p of the elements as eager does (n = 32 x 64 x 32 = 65,536
    elements: 5 standard errors = 0.006)."""
    trainer = cuda_trainer(packed_env, tmp_path, BATCHSIZE="32", **GRAPHED)
    micro = next(trainer.batches)
    embeddings = trainer.plan.core.bert.embeddings.train()
    ids = [micro.inputs[k] for k in ("input_ids", "segment_ids", "position_ids")]

    def masks(fn) -> list[torch.Tensor]:
        with torch.no_grad(), trainer.autocast():
            return [(fn(*ids) != 0).clone() for _ in range(CALLS)]

    eager = masks(embeddings)[0]
    replays = masks(graphed(embeddings))[-2:]
    assert not torch.equal(replays[0], replays[1])
    everything = torch.ones_like(eager)
    assert_rates(*keep_rates([eager], everything), keep_rates(replays, everything), 1 - P,
                 eager.numel())


def test_flash_dropout_keep_rate_under_replay(packed_env, tmp_path):  # noqa: F811
    """Attention's dropout on the flash path, on a packed batch's segments (32 rows of L = 64
    tokens, 4 heads of 64: keep_mask_of reads the masks): replays draw new masks, keeping
    (floor((1 - p) * 255) + 1) / 256 = 0.8984 of the probabilities (the kernel's 8-bit
    threshold) as eager does."""
    trainer = cuda_trainer(packed_env, tmp_path, BATCHSIZE="32", **GRAPHED)
    micro = next(trainer.batches)
    cu, max_seqlen = micro.inputs["cu_seqlens"], micro.inputs["max_seqlen"]
    qkv = torch.randn(micro.inputs["input_ids"].numel(), 3, 4, L, device="cuda",
                      dtype=torch.bfloat16)
    if not flash_supported(qkv):
        pytest.skip("the flash kernels need sm80 or newer")
    eager = keep_mask_of(varlen_attention, qkv, cu, max_seqlen, P, seed=0)
    attend = graphed(varlen_attention)
    replays = [keep_mask_of(attend, qkv, cu, max_seqlen, P, seed=s) for s in range(CALLS)][-2:]
    assert not torch.equal(replays[0], replays[1])
    real = torch.zeros_like(eager)
    for i, n in enumerate((cu[1:] - cu[:-1]).tolist()):
        real[i, :, :n, :n] = True
    expected = (math.floor((1 - P) * 255) + 1) / 256
    assert_rates(*keep_rates([eager], real), keep_rates(replays, real), expected,
                 int(real.sum()))
