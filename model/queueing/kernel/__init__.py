"""The model's compiled kernel: numba functions over the state table, chain and latencies."""
