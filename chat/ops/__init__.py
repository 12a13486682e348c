"""Running the process: start-up, graceful shutdown, health probes and the metrics view."""
