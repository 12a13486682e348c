"""chat: conversations, streamed chat turns, limits and device tiers."""
