"""The rules of decoding that the engines and the speculation above them share: sampling, the LLM's
penalties, lossless verification of a draft, one engine call's request and result, and token-sequence
helpers. Imports nothing of the package but `text` and `errors`."""
