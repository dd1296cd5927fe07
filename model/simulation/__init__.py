"""Request-level simulator of vLLM's scheduler, with its workloads and replica state."""
