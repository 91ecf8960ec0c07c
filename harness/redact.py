"""
HARNESS: secrets. Decides which environment variables train.py and prepare.py get (an allow-list, never a secret)
and replaces secret values in any text before it is logged, printed or sent to the LLM. Must never log or return a
secret's value.
"""

import os
import re

# Environment variables a training run may need: the toolchain (Python, CUDA/ROCm, compilers, BLAS threads), the
# caches it reads, the locale and terminal, and the harness's own AUTORESEARCH_* settings. Anything else (cloud
# credentials, tokens, proxies with passwords, the user's own variables) stays out of train.py's process.
ALLOWED_NAMES = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "HOSTNAME",
                 "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "CC", "CXX", "MPLCONFIGDIR", "TOKENIZERS_PARALLELISM",
                 "NO_COLOR", "COLUMNS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                 "HF_HOME", "SYSTEMROOT"}
ALLOWED_PREFIXES = ("AUTORESEARCH_", "PYTHON", "LC_", "XDG_", "CUDA_", "NVIDIA_", "NCCL_", "CUBLAS_", "CUDNN_",
                    "PYTORCH_", "TORCH", "TRITON_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "ROCM_", "HIP_", "HSA_",
                    "ROCR_", "DYLD_", "HF_HUB_", "HF_DATASETS_", "TRANSFORMERS_")
# A name is a secret when one of its _-separated words is one of these (HF_TOKEN, WANDB_API_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD, GITHUB_PAT), whatever the allow-list says; TOKENIZERS_PARALLELISM is not.
SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PAT", "CREDENTIAL", "CREDENTIALS",
                "AUTH", "COOKIE"}


def is_secret_name(name):
    """True for an environment variable that holds a credential: never passed to a run, redacted from every record."""
    return any(word in SECRET_WORDS for word in re.split(r"[_\W]+", name.upper()))


def clean_env():
    """The environment a training or prepare.py subprocess gets: the allow-listed variables of os.environ, minus
    every secret-looking name."""
    return {k: v for k, v in os.environ.items()
            if (k in ALLOWED_NAMES or k.startswith(ALLOWED_PREFIXES)) and not is_secret_name(k)}


# user:password@ in a URL (an index URL, a proxy, --base-url): the password part is redacted whatever the variable.
URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@", re.I)


def secret_values():
    """The values of the secret-named variables in the environment now (8+ characters: shorter values are too
    likely to be ordinary words), longest first so that one value inside another goes whole."""
    return sorted((v for k, v in os.environ.items() if is_secret_name(k) and len(v) >= 8), key=len, reverse=True)


def redact(text, values=None):
    """Replace every secret value (values: secret_values(), read now when None) in text by [redacted], and the
    password of any user:password@ URL."""
    for value in secret_values() if values is None else values:
        text = text.replace(value, "[redacted]")
    return URL_CREDENTIALS.sub(r"\1[redacted]@", text)


def redact_all(obj, values=None):
    """redact() applied to every string inside a JSON-like object (before it is serialised, so that escaping a
    quote or a non-ASCII character in a secret cannot hide it); the environment is read once per object."""
    values = secret_values() if values is None else values
    if isinstance(obj, str):
        return redact(obj, values)
    if isinstance(obj, dict):
        return {k: redact_all(v, values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_all(v, values) for v in obj]
    return obj
