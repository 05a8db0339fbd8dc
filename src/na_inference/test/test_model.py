"""The network: reference size, shapes, gated attention, normalization inside DeployableModel, checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from na_inference.features import default_spec
from na_inference.model import (
    DeployableModel,
    GatedSelfAttention,
    ModelConfig,
    NeuralActuatorNet,
    count_parameters,
    load_checkpoint,
    save_checkpoint,
)


def fitted_spec():
    spec = default_spec("so101")
    rng = np.random.default_rng(1)
    return type(spec)(spec.robot, spec.joint_names, spec.quantities, spec.history, spec.dt,
                      rng.normal(size=42).astype(np.float32), rng.uniform(0.1, 2, 42).astype(np.float32))


def test_reference_preset_has_the_papers_size() -> None:
    net = NeuralActuatorNet(ModelConfig.preset("reference", n_features=42, n_joints=6))
    assert 1.43e6 < count_parameters(net) < 1.45e6  # method.md: about 1.44 M
    small = NeuralActuatorNet(ModelConfig.preset("small", n_features=42, n_joints=6))
    assert count_parameters(small) < 0.1 * count_parameters(net)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.preset("huge", 42, 6)


def test_output_shapes_and_no_causal_mask() -> None:
    torch.manual_seed(0)
    net = NeuralActuatorNet(ModelConfig.preset("small", 42, 6)).eval()
    x = torch.randn(5, 9, 42)
    out = net(x)
    assert out["torque"].shape == (5, 6) and out["force_raw"].shape == (5, 3)
    assert out["gate_logit"].shape == (5, 1) and out["condition_logit"].shape == (5, 6)
    # The oldest token reaches the output (full window attended, no causal mask).
    x2 = x.clone()
    x2[:, 0] += 1.0
    assert not torch.allclose(net(x2)["torque"], out["torque"])


def test_gate_scales_attention_output() -> None:
    torch.manual_seed(0)
    attn = GatedSelfAttention(16, 2, 0.0)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        attn.query_gate.bias[16:] = -1e4  # gate s -> sigmoid(s) = 0: heads output nothing
    out = attn(x)
    assert torch.allclose(out, attn.out.bias.expand_as(out), atol=1e-6)


def test_deployable_model_normalizes_inside() -> None:
    torch.manual_seed(0)
    spec = fitted_spec()
    net = NeuralActuatorNet(ModelConfig.preset("small", 42, 6)).eval()
    model = DeployableModel(net, spec).eval()
    telemetry = np.random.default_rng(2).normal(size=(4, 9, 42)).astype(np.float32) * 3
    torque, force, prob, cond = model(torch.from_numpy(telemetry))
    direct = net(torch.from_numpy(spec.normalize(telemetry)))
    gate = torch.sigmoid(direct["gate_logit"])
    assert torch.allclose(torque, direct["torque"], atol=1e-6)
    assert torch.allclose(force, gate * direct["force_raw"], atol=1e-6)
    assert torch.allclose(prob, gate) and prob.shape == (4, 1)
    assert torch.all((cond >= 0) & (cond <= 1))
    with pytest.raises(ValueError, match="does not fit the network"):
        DeployableModel(NeuralActuatorNet(ModelConfig.preset("small", 36, 5)), spec)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    spec = fitted_spec()
    cfg = ModelConfig.preset("small", 42, 6)
    net = NeuralActuatorNet(cfg).eval()
    path = tmp_path / "ckpt" / "model.pt"
    save_checkpoint(path, net, cfg, spec, {"step": 7, "metrics": {"val": 0.5}})
    net2, cfg2, spec2, extra = load_checkpoint(path)
    assert cfg2 == cfg and extra == {"step": 7, "metrics": {"val": 0.5}}
    assert np.array_equal(spec2.mean, spec.mean) and spec2.feature_names == spec.feature_names
    x = torch.randn(3, 9, 42)
    assert torch.equal(net2.eval()(x)["torque"], net(x)["torque"])
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt")


def test_checkpoint_extra_with_numpy_loads_safely(tmp_path: Path) -> None:
    spec = fitted_spec()
    cfg = ModelConfig.preset("small", 42, 6)
    path = tmp_path / "m.pt"
    save_checkpoint(path, NeuralActuatorNet(cfg), cfg, spec,
                    {"val_curve": np.arange(3.0), "best": np.float32(0.25), "data": [tmp_path]})
    _, _, _, extra = load_checkpoint(path)
    assert torch.equal(extra["val_curve"], torch.arange(3.0, dtype=torch.float64))
    assert extra["best"] == 0.25 and extra["data"] == [str(tmp_path)]
