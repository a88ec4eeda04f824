"""Contract suite shared by every expert perturbation operator (003 App. D; 000 App. A.6):
shapes kept, deterministic under a seed, identity at zero strength, source untouched."""

import pytest
import torch

from moe_core.errors import ConfigError
from moe_core.upcycle import (
    ExpertWeights,
    Perturbation,
    add_noise,
    apply_perturbation,
    drop_reinit,
    interpolate,
    scale_copy,
)

R, D, F = 3, 8, 12


def experts(seed: int = 0) -> ExpertWeights:
    g = torch.Generator().manual_seed(seed)
    return ExpertWeights(torch.randn(R, D, F, generator=g), torch.randn(R, D, F, generator=g),
                         torch.randn(R, F, D, generator=g) * 0.5)


# name -> (op at a non-zero strength, op at zero strength, random?)
OPS = {
    "noise": (lambda w, nb, g: add_noise(w, 0.05, generator=g),
              lambda w, nb, g: add_noise(w, 0.0, generator=g), True),
    "scale": (lambda w, nb, g: scale_copy(w, 0.9), lambda w, nb, g: scale_copy(w, 1.0), False),
    "drop-normal": (lambda w, nb, g: drop_reinit(w, 0.5, init="normal", generator=g),
                    lambda w, nb, g: drop_reinit(w, 0.0, generator=g), True),
    "drop-xavier": (lambda w, nb, g: drop_reinit(w, 0.3, init="xavier", generator=g),
                    lambda w, nb, g: drop_reinit(w, 0.0, init="xavier", generator=g), True),
    "drop-kaiming": (lambda w, nb, g: drop_reinit(w, 0.7, init="kaiming", generator=g),
                     lambda w, nb, g: drop_reinit(w, 0.0, init="kaiming", generator=g), True),
    "interpolate": (lambda w, nb, g: interpolate(w, nb, 0.5),
                    lambda w, nb, g: interpolate(w, nb, 1.0), False),
    "combined": (
        lambda w, nb, g: apply_perturbation(
            w, Perturbation(noise=0.01, scale=0.95, drop_fraction=0.3, interpolate=0.7),
            generator=g, neighbour=nb),
        lambda w, nb, g: apply_perturbation(w, Perturbation(), generator=g, neighbour=nb),
        True,
    ),
}


def run(op, seed=0):
    w, nb = experts(0), experts(1)
    return op(w, nb, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", OPS)
def test_shapes_and_dtype_kept(name):
    out = run(OPS[name][0])
    for a, b in zip(out, experts(0)):
        assert a.shape == b.shape and a.dtype == b.dtype


@pytest.mark.parametrize("name", OPS)
def test_deterministic_under_seed(name):
    op, _, is_random = OPS[name]
    a, b, c = run(op, 0), run(op, 0), run(op, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    if is_random:
        assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("name", OPS)
def test_identity_at_zero_strength_and_change_otherwise(name):
    op, zero, _ = OPS[name]
    w = experts(0)
    assert all(torch.equal(x, y) for x, y in zip(run(zero), w))
    assert not all(torch.equal(x, y) for x, y in zip(run(op), w))


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("strength", ["zero", "nonzero"])
def test_source_untouched_and_not_aliased(name, strength):
    op = OPS[name][0] if strength == "nonzero" else OPS[name][1]
    w, nb = experts(0), experts(1)
    w0, nb0 = [t.clone() for t in w], [t.clone() for t in nb]
    out = op(w, nb, torch.Generator().manual_seed(0))
    for t in out:
        t.add_(1.0)  # writing into the result must not reach the inputs
    assert all(torch.equal(x, y) for x, y in zip(w, w0))
    assert all(torch.equal(x, y) for x, y in zip(nb, nb0))


def test_drop_reinit_replaces_whole_hidden_units():
    w = experts(0)
    out = drop_reinit(w, 0.5, generator=torch.Generator().manual_seed(0))
    n = round(0.5 * F)
    for r in range(R):
        changed_gate = (out.gate[r] != w.gate[r]).any(0)  # per hidden unit (column)
        changed_up = (out.up[r] != w.up[r]).any(0)
        changed_down = (out.down[r] != w.down[r]).any(1)  # per hidden unit (row)
        assert int(changed_gate.sum()) == n
        assert torch.equal(changed_gate, changed_up) and torch.equal(changed_gate, changed_down)


def test_noise_is_calibrated_to_each_matrix():
    g = torch.Generator().manual_seed(0)
    w = ExpertWeights(torch.randn(2, 64, 64, generator=g), torch.randn(2, 64, 64, generator=g),
                      torch.randn(2, 64, 64, generator=g) * torch.tensor([0.1, 3.0])[:, None, None])
    out = add_noise(w, 0.1, generator=torch.Generator().manual_seed(0))
    for a, b in zip(out, w):  # 4096 draws per matrix: the std estimate is within ~2 %
        ratio = (a - b).std(dim=(1, 2)) / b.std(dim=(1, 2))
        assert torch.allclose(ratio, torch.full((2,), 0.1), rtol=0.06)


@pytest.mark.parametrize("kw,match", [
    ({"noise": -0.1}, "perturb.noise"),
    ({"scale": 0.0}, "perturb.scale"),
    ({"drop_fraction": 1.5}, "perturb.drop_fraction"),
    ({"drop_init": "uniform"}, "perturb.drop_init"),
    ({"interpolate": 2.0}, "perturb.interpolate"),
])
def test_perturbation_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        Perturbation(**kw)


def test_interpolate_needs_neighbour():
    with pytest.raises(ConfigError, match="interpolate"):
        apply_perturbation(experts(0), Perturbation(interpolate=0.5),
                           generator=torch.Generator().manual_seed(0))
