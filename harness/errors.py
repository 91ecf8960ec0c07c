"""
HARNESS: the two ways a problem ends the loop. Owns nothing else; never catches anything.
"""


class SetupError(Exception):
    """Bad input or state before the loop starts: the message names the problem and the fix (exit code 2)."""


class Stop(Exception):
    """The loop must end now (auth error, blocking hook, circuit breaker ...); the message says why (exit code 1)."""
