"""A frozen copy of the model as it stood before the fast kernel (issue 19), main at a3d9c48.

Imported only by the speed benches, which run it beside today's model in the same process so a
speed ratio does not depend on the machine's load. Its imports are rewritten to this package
(`bench.baseline.vendor.model`); it is never edited, linted, type-checked or collected by pytest,
and it lives under `vendor/` so the duplicates check passes over it.
"""
