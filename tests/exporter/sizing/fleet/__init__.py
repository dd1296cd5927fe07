"""Fleet optimizer tests: against exhaustive search, properties, the lone deployment."""
