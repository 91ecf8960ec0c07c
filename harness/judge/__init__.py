"""
HARNESS, judging: the verdict rules (verdict) and their statistics (stats), the early-cancel rules on learning curves
(curves), the held-out check of the gain (holdout). Imports nothing of the tag, proposing or recording packages
(tests/test_structure.py).
"""
