"""The analytic queueing model: parameters, chunking, the birth-death chain, analysis and sizing."""
