"""sage-rl: Skill Augmented GRPO for self-Evolution (arXiv 2512.17102)."""

__version__ = "0.1.0"
