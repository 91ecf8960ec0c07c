"""
HARNESS, proposing: the LLM providers and proposers, the ideas and their edits, the prompts, the numeric search and
its study, the hybrid, the memory (tabu, bandit), the outer loop and its mechanisms, and `try` for an external agent
(external).
"""
