"""The model server: a pooled OpenAI-compatible streaming client. No Django, no models."""
