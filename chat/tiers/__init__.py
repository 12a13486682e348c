"""Device tiers: a request's device signals → a tier (full or lite) → the model that answers."""
