"""A request's way into and out of the decode loop, free of Triton: parsing the tensorrt_llm_bls
inputs (request.py), KV admission (admission.py), and the flow from parsed request to streamed
text (flow.py)."""
