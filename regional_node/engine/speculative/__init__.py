"""Speculative decoding: proposers (ngram.py), verification of the proposed tokens against the
target model's logits (verify.py), and when to speculate (policy.py)."""
