"""The daemon: its cycle, state file, scheduler, HTTP server, exposition and log lines."""
