"""Regional compilation (train.compile="blocks"): the same numbers as eager, and one block graph
shared by every block, so compile work does not grow with depth."""
import copy

import pytest
import torch

from sigprop.models import ModelConfig, build_model
from sigprop.train.parallel import compile_model


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["dslm", "shaped"])
def test_compiled_blocks_match_eager_and_share_one_graph(scheme):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", scheme=scheme, vocab_size=64, d_model=32, n_layers=4, n_heads=4,
                      max_seq_len=16)
    eager = build_model(cfg)
    compiled = copy.deepcopy(eager)
    compile_model(compiled, "blocks")
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    ids = torch.randint(0, 64, (4, 16))
    outs = []
    for model in (eager, compiled):
        logits = model(ids)
        logits.square().mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    # fp32; inductor fuses and reorders elementwise work, so agreement is to rounding, not bitwise: O(1) logits
    # differ by up to 1.1e-6 (about 10 ulps) at this seed, so the bound is 5e-6 absolute
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=5e-6)
    for name, g in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], g, rtol=1e-4, atol=1e-7, msg=name)
    assert counters["stats"]["unique_graphs"] == 1      # four blocks, one compiled graph
