"""The least-cost fleet: replica counts across model-accelerator variants within the GPUs
there are (inputs and plan values, exact evaluation, the MILP, the per-cycle decision)."""
