"""vllm-sizer's I/O side: collector, recommender daemon, HTTP server, emulator and CLI."""
