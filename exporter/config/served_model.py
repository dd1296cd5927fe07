"""Configuration sections that describe the served model: its initial parameters, the model
options (variant, coefficients of variation, architecture) and the accelerator preset, which
together give the tuner its prior."""

from __future__ import annotations

from typing import Any

from exporter.config.checks import KeyReader, choice, integer, number
from model import ArchitectureSpec, ModelOptions, ModelVariant, ServiceParams
from model.calibration.prior import Accelerator

# The workload CVs a config may give; a given one is pinned (the measured one is not used).
CV_KEYS = ("arrival_cv", "input_length_cv", "output_length_cv")


def initial_params(r: KeyReader, node: Any, path: str) -> ServiceParams | None:
    if node is None:
        return None
    m = r.mapping(node, path, {"alpha_ms", "beta_ms", "gamma_ms"})
    values = [
        r.required(m, key, path, number(0.0), "a number > 0 (ms)")
        for key in ("alpha_ms", "beta_ms", "gamma_ms")
    ]
    alpha, beta, gamma = values
    if alpha is None or beta is None or gamma is None:
        return None
    return ServiceParams(alpha, beta, gamma)


def model_options(r: KeyReader, node: Any, path: str) -> ModelOptions:
    if node is None:
        return ModelOptions()
    keys = {"variant", "arrival_cv", "input_length_cv", "output_length_cv", "architecture"}
    m = r.mapping(node, path, keys)
    variants = tuple(v.value for v in ModelVariant)
    default = ModelOptions()
    variant = r.get(
        m,
        "variant",
        path,
        choice(variants),
        f"must be one of {', '.join(variants)}",
        default.variant.value,
    )
    cvs = {
        key: r.get(
            m,
            key,
            path,
            number(0.0, inclusive=True),
            "must be a number >= 0 (a coefficient of variation)",
            getattr(default, key),
        )
        for key in CV_KEYS
    }
    architecture = None
    if m.get("architecture") is not None:
        architecture = _architecture(r, m["architecture"], f"{path}.architecture")
    return ModelOptions(variant=ModelVariant(variant), architecture=architecture, **cvs)


_ARCHITECTURE_KEYS = {
    "num_layers", "hidden_size", "num_parameters", "num_kv_heads", "head_dim", "kv_cache_bytes"
}  # fmt: skip


MAX_PARAMETERS = 1e14  # 100 trillion
MAX_LAYERS = 10_000
MAX_WIDTH = 1 << 20  # hidden size, KV heads, head dimension
MAX_KV_BYTES = 16.0  # bytes per cached element (fp32 is 4)


def _architecture(r: KeyReader, node: Any, path: str) -> ArchitectureSpec | None:
    a = r.mapping(node, path, _ARCHITECTURE_KEYS)
    # Bounds well above any model served today: beyond them the physical prior's centre is
    # no engine's (1e300 parameters put alpha at 1e288 ms).
    layers = r.required(
        a, "num_layers", path, integer(1, MAX_LAYERS), f"an integer from 1 to {MAX_LAYERS}"
    )
    hidden = r.required(
        a, "hidden_size", path, integer(1, MAX_WIDTH), f"an integer from 1 to {MAX_WIDTH}"
    )
    params = r.required(
        a, "num_parameters", path, number(0.0, MAX_PARAMETERS),
        f"a number > 0 and <= {MAX_PARAMETERS:g}",
    )  # fmt: skip
    heads = r.get(
        a, "num_kv_heads", path, integer(1, MAX_WIDTH),
        f"must be an integer from 1 to {MAX_WIDTH}", None,
    )  # fmt: skip
    head_dim = r.get(
        a, "head_dim", path, integer(1, MAX_WIDTH), f"must be an integer from 1 to {MAX_WIDTH}",
        None,
    )  # fmt: skip
    kv_bytes = r.get(
        a, "kv_cache_bytes", path, number(0.0, MAX_KV_BYTES),
        f"must be a number > 0 and <= {MAX_KV_BYTES:g} (bytes per element)", 2.0,
    )  # fmt: skip
    if (heads is None) != (head_dim is None):
        r.fail(path, "must set num_kv_heads and head_dim together (the KV-cache shape)", dict(a))
        return None
    if layers is None or hidden is None or params is None:
        return None
    return ArchitectureSpec(layers, hidden, params, heads, head_dim, kv_bytes)


def accelerator_preset(r: KeyReader, node: Any, path: str) -> Accelerator | None:
    """An accelerator preset name, or None when the key is absent."""
    names = tuple(a.value for a in Accelerator)
    parent, _, key = path.rpartition(".")
    r.note(parent, key, f"must be one of {', '.join(names)}")
    if node is None:
        return None
    if node not in names:
        r.fail(path, f"must be one of {', '.join(names)}", node)
        return None
    return Accelerator(node)
