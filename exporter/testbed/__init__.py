"""Emulated vLLM replicas in real time behind /metrics, and a load generator for them."""
