"""What every layer of the exporter shares: the clock, the error types and plot axes."""
