"""The settings of the daphne processes the tests start: production's, but for the hashers.

Every signup and login through a test server hashes a password with production's PBKDF2
(1,000,000 iterations, ~0.4 s of CPU here); the suite signs up some five hundred users through
real servers, minutes of CPU that test nothing the tests look at. Passwords hashed here are in
the same `pbkdf2_sha256` format with one iteration (tests/hashers.py), which production's
hasher checks too. Nothing else differs from `chatsite.settings`.
"""

from django.conf import global_settings

from chatsite.settings import *  # noqa: F403

PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher", *global_settings.PASSWORD_HASHERS]
