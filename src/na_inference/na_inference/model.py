"""The NeuralActuator network (method.md): a small Transformer over the telemetry history with gated
attention and torque / force + contact gate / motor-condition heads.

Attention is written out by hand (no nn.MultiheadAttention) so the dynamo ONNX export is a plain graph.
``DeployableModel`` wraps the network with the feature normalization as buffers: its input is
physical-unit telemetry and its outputs are exactly the ONNX contract's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .features import CLIP, FeatureSpec


@dataclass
class ModelConfig:
    n_features: int
    n_joints: int
    history: int = 8
    d_model: int = 192
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 384
    dropout: float = 0.1
    torque_hidden: tuple[int, ...] = (96, 192)
    force_hidden: tuple[int, ...] = (192,)
    condition_hidden: tuple[int, ...] = (96,)

    def __post_init__(self) -> None:
        self.torque_hidden = tuple(self.torque_hidden)
        self.force_hidden = tuple(self.force_hidden)
        self.condition_hidden = tuple(self.condition_hidden)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")

    @classmethod
    def preset(cls, name: str, n_features: int, n_joints: int, **overrides: Any) -> ModelConfig:
        """A named size ("reference" = the paper's ~1.44 M parameters, "small" for CPU training)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})")
        return cls(n_features=n_features, n_joints=n_joints, **{**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("torque_hidden", "force_hidden", "condition_hidden"):
            out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


PRESETS: dict[str, dict[str, Any]] = {
    "reference": dict(d_model=192, n_heads=4, n_layers=4, d_ff=384, dropout=0.1,
                      torque_hidden=(96, 192), force_hidden=(192,), condition_hidden=(96,)),
    "small": dict(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.1,
                  torque_hidden=(64, 64), force_hidden=(64,), condition_hidden=(32,)),
}


class GatedSelfAttention(nn.Module):
    """Multi-head self-attention whose query projection also yields a gate s: out = attn(q, k, v) * sigmoid(s)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query_gate = nn.Linear(d_model, 2 * d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, s = self.query_gate(x).chunk(2, dim=-1)

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v, s = heads(q), heads(self.key(x)), heads(self.value(x)), heads(s)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        weights = self.attn_dropout(torch.softmax(scores, dim=-1))
        mixed = torch.matmul(weights, v) * torch.sigmoid(s)
        return self.out(mixed.transpose(1, 2).reshape(b, t, d))


class TransformerLayer(nn.Module):
    """Pre-norm block: x + attn(LN(x)), then x + FF(LN(x)) with GELU."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(cfg.d_model)
        self.attn = GatedSelfAttention(cfg.d_model, cfg.n_heads, cfg.dropout)
        self.norm_ff = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Dropout(cfg.dropout),
                                nn.Linear(cfg.d_ff, cfg.d_model))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm_attn(x)))
        return x + self.dropout(self.ff(self.norm_ff(x)))


def mlp(d_in: int, hidden: tuple[int, ...], d_out: int) -> nn.Sequential:
    """Linear layers with SiLU between them."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(d_in, width), nn.SiLU()]
        d_in = width
    layers.append(nn.Linear(d_in, d_out))
    return nn.Sequential(*layers)


class NeuralActuatorNet(nn.Module):
    """Normalized telemetry windows [B, H+1, F] -> torque [B, J] N.m, force_raw [B, 3] N, gate_logit [B, 1],
    condition_logit [B, J]. No causal mask: every token sees the whole window."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Linear(cfg.n_features, cfg.d_model)
        self.position = nn.Parameter(torch.zeros(cfg.history + 1, cfg.d_model))
        nn.init.normal_(self.position, std=0.02)
        self.input_dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.torque_head = mlp(cfg.d_model, cfg.torque_hidden, cfg.n_joints)
        self.force_head = mlp(cfg.d_model, cfg.force_hidden, 3)
        self.gate_head = nn.Linear(cfg.d_model, 1)
        self.condition_head = mlp(cfg.d_model, cfg.condition_hidden, cfg.n_joints)

    def encode(self, x_norm: torch.Tensor) -> torch.Tensor:
        """[B, H+1, F] -> pooled [B, d_model]."""
        h = self.input_dropout(self.embed(x_norm) + self.position)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h).mean(dim=1)

    def forward(self, x_norm: torch.Tensor) -> dict[str, torch.Tensor]:
        pooled = self.encode(x_norm)
        return {
            "torque": self.torque_head(pooled),
            "force_raw": self.force_head(pooled),
            "gate_logit": self.gate_head(pooled),
            "condition_logit": self.condition_head(pooled),
        }


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class DeployableModel(nn.Module):
    """Physical-unit telemetry [B, H+1, F] -> (torque, force = gate * force_raw, contact_probability, condition).

    Normalization ((x - mean) / std clipped to +-10) is inside, from buffers, so the exported graph takes
    raw telemetry exactly as the runtime builds it.
    """

    def __init__(self, net: NeuralActuatorNet, spec: FeatureSpec) -> None:
        super().__init__()
        if spec.n_features != net.config.n_features or spec.history != net.config.history:
            raise ValueError(
                f"feature spec ({spec.n_features} features, history {spec.history}) does not fit the network "
                f"({net.config.n_features} features, history {net.config.history})"
            )
        self.net = net
        self.register_buffer("feature_mean", torch.from_numpy(np.array(spec.mean, dtype=np.float32)))
        self.register_buffer("feature_std", torch.from_numpy(np.array(spec.std, dtype=np.float32)))

    def forward(self, telemetry: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.clamp((telemetry - self.feature_mean) / self.feature_std, -CLIP, CLIP)
        out = self.net(x)
        gate = torch.sigmoid(out["gate_logit"])
        return out["torque"], gate * out["force_raw"], gate, torch.sigmoid(out["condition_logit"])


def save_checkpoint(path: str | Path, net: NeuralActuatorNet, config: ModelConfig, spec: FeatureSpec,
                    extra: dict[str, Any] | None = None) -> None:
    """Weights + config + feature spec (as contract metadata) + free ``extra`` (plain types / tensors;
    numpy arrays become tensors, Paths strings), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": "neuralactuator-checkpoint-1",
        "state_dict": net.state_dict(),
        "config": config.to_dict(),
        "feature_spec": spec.to_metadata(),
        "extra": _plain(dict(extra or {})),
    }
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def _plain(value: Any) -> Any:
    """numpy values -> Python/tensors, so the checkpoint loads with ``weights_only=True``."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> tuple[NeuralActuatorNet, ModelConfig, FeatureSpec,
                                                                          dict[str, Any]]:
    """Inverse of ``save_checkpoint`` (weights_only load: no code runs from the file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or "state_dict" not in payload or "config" not in payload:
        raise ValueError(f"{path} is not a NeuralActuator checkpoint (missing state_dict/config)")
    config = ModelConfig.from_dict(payload["config"])
    spec = FeatureSpec.from_metadata(payload["feature_spec"])
    net = NeuralActuatorNet(config)
    net.load_state_dict(payload["state_dict"])
    return net, config, spec, dict(payload.get("extra", {}))
