"""The command-line entry point and one module per subcommand."""
