"""Distilled speculative models: small drafts trained from the LLM's own greedy output (`make distill`)."""
