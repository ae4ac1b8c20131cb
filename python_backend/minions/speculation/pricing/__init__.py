"""Whether a draft is worth it, and how long: the LLM's verification cost curve (`verify_costs`),
drafting costs and acceptance (`length_stats`), the adaptive length policy (`draft_length`), a draft
priced by its own chances and a request's calibration of them (`worth`), and the gates that turn
drafting off by load (`gates`)."""
