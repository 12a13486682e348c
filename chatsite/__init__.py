"""chatsite: the Django project (settings, ASGI entry point, URLs)."""
