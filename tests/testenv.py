"""A pytest plugin loaded before pytest-django reads settings: the test environment.

Tests run with production-like settings (DEBUG off), so they need a secret key; it is not secret.
"""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "tests-only-not-a-secret-0123456789abcdefghijklmnop")
os.environ.setdefault("DJANGO_SECURE", "0")
