"""Helpers the benches share; every entry point sits at the top of bench/."""
