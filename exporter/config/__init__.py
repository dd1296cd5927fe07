"""The daemon's configuration: frozen values, the YAML loader and its key checks."""
