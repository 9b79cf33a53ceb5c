"""Synthetic data generation stage: prompts from a dataset -> target-model answers with reasoning."""
