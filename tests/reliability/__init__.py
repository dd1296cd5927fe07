"""Reliability tests: slow, lying and hostile sources, clients, files and clocks."""
