"""A password hasher for passwords the tests make in their own process.

Production's PBKDF2 runs 1,000,000 iterations (~0.3 s per password here, several seconds on a
loaded machine), and the tests make hundreds of users. This one writes the same `pbkdf2_sha256`
format with a single iteration, so a daphne started by a test, with production's hashers, still
checks these passwords (the count is in the hash) and upgrades them when they log in there.
Passwords set through a real server (signups, password changes) keep production's cost.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
