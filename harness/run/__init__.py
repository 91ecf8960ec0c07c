"""
HARNESS, a run: one training of one commit and its separate evaluation, wherever it goes. The run's spec and the
backends (backends, and the node-side body every backend shares: node; Ray: cluster), the devices (pool), the
process and its limits (runner, processes), the sandbox and what it shows (sandbox, view), the guard of the records,
resource usage, the speed probe (conditions), the hardware fingerprint, the target's contract (target). Imports
nothing of the tag, proposing or recording packages (tests/test_structure.py).
"""
