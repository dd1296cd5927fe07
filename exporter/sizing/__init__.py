"""The pure sizing layer: observations and estimates in, replica counts and predictions out."""
