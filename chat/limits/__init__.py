"""Per-user limits on chat turns (rate, daily tokens, concurrent streams) and recorded usage."""
