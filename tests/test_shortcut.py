"""The shortcut factor s = rms(α⊙x)/rms(α⊙x + βf(x)) of a post-norm sublayer is the share of its output gradient
that reaches its input along the shortcut (`sigprop.diagnostics.shortcut`)."""
import torch
from torch import nn

from sigprop.diagnostics.shortcut import shortcut_factors
from sigprop.nn.block import Sublayer
from sigprop.nn.mlp import MLP


class Detached(nn.Module):
    """``fn`` on a detached input: the input's gradient then flows along the shortcut only."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x.detach())


def test_the_shortcut_factor_is_the_gradient_ratio_along_the_shortcut():
    torch.manual_seed(0)
    d, ratios, factors = 512, [], []
    for alpha, beta in ((1.0, 0.3), (0.3, 3.0), (2.0, 1.0)):
        mlp = MLP(d, 4 * d, nn.ReLU()).double()
        sub = Sublayer(Detached(mlp), nn.LayerNorm(d).double(), "post", alpha, beta)
        x = nn.functional.layer_norm(torch.randn(4, 32, d, dtype=torch.float64), (d,)).requires_grad_()
        with shortcut_factors(sub) as s:
            y = sub(x)
        dy = torch.randn_like(y)
        y.backward(dy)
        ratios.append(float(x.grad.norm() / dy.norm()))
        factors.append(s[0])
    # x is a norm's output (rms 1), so the gradient ratio α/rms(sum) equals s; LayerNorm's Jacobian removes 2 of
    # the d directions of a random dy (relative change 1/d) and the ratio's sampling error is ~1/√(B·T·d)
    torch.testing.assert_close(torch.tensor(ratios), torch.tensor(factors), rtol=0.01, atol=0)
    assert factors[0] > 0.9 and factors[1] < 0.5          # a small branch keeps the gradient, a large one cuts it
