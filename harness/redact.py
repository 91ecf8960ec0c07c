"""
HARNESS: secrets. Decides which environment variables are secrets (never passed to train.py or prepare.py) and
replaces their values in any text before it is logged or printed. Must never log or return a secret's value.
"""

import os


def is_secret_name(name):
    """Environment variables that hold API keys: never passed to train.py, redacted from every record."""
    return name.endswith("_API_KEY") or name in ("ANTHROPIC_AUTH_TOKEN", "OPENAI_ADMIN_KEY")


def clean_env():
    """os.environ without the secrets: the environment a training or prepare.py subprocess gets."""
    return {k: v for k, v in os.environ.items() if not is_secret_name(k)}


def redact(text):
    """Replace the value of every API-key variable in the environment by [redacted]."""
    for name, value in os.environ.items():
        if is_secret_name(name) and len(value) >= 8:
            text = text.replace(value, "[redacted]")
    return text
