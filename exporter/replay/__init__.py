"""Trace-driven replay of the whole scaling loop: the simulator fleet, the real observation
path, several autoscaling policies on the same arrivals, and their report (`vllm-sizer replay`,
bench/closed_loop.py)."""
