"""Opt-in tests against real third-party model servers (scripts/real_upstream.sh runs them)."""
