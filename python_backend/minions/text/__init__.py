"""Text around the tokens: the prompt and chat template, incremental detokenisation, stop strings,
bad words."""
