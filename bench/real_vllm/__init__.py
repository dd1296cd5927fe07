"""Validation against a real vLLM server (CPU build): setup, server lifetime, sweep. Issue 9."""
