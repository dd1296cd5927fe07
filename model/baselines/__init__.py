"""Other autoscalers' analyzers, kept for comparison with the queueing model."""
