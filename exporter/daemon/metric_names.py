"""What every exported family shares: the name prefix, the per-deployment labels and the
ms -> s factor (internal values are ms, exported ones seconds)."""

PREFIX = "vllm_sizer_"
LABELS = ("deployment", "model_name")
S_PER_MS = 1e-3
