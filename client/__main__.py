"""`python -m client "prompt"`: stream a completion from the minions model and print it as it comes."""

from __future__ import annotations

import argparse
import sys

from .api import GenerationParams, MinionsClientError, generate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client", description=__doc__)
    p.add_argument("prompt")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--url", help="host:port (default 127.0.0.1:8001 for gRPC, 127.0.0.1:8000 for HTTP)")
    p.add_argument("--model", default="minions")
    p.add_argument("--no-stream", action="store_true", help="one response at the end (HTTP: /generate)")
    p.add_argument("--raw", action="store_true", help="send the text as is (no chat template)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--repetition-penalty", type=float, help="> 1 discourages tokens already in the text")
    p.add_argument("--presence-penalty", type=float, help="subtracted once from each token already generated")
    p.add_argument("--frequency-penalty", type=float, help="subtracted per occurrence of each generated token")
    p.add_argument("--min-tokens", type=int, help="no end token before this many tokens")
    p.add_argument("--speculation", help="off | vote[:<ssm>,...] | bandit[:<ssm>,...] | single:<ssm> (default: the deployment's)")
    p.add_argument("--num-draft-tokens", type=int, help="fix the draft length (default: adaptive)")
    p.add_argument("--pipeline", choices=["on", "off"], help="draft the next round during verification "
                   "(default: the deployment's)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for each response before cancelling the request (default 600)")
    p.add_argument("--timing", action="store_true", help="print TTFT, tokens/s and acceptance to stderr")
    a = p.parse_args(argv)
    params = GenerationParams(
        max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed,
        stop_words=a.stop, speculation=a.speculation, num_draft_tokens=a.num_draft_tokens, chat=not a.raw,
        pipeline=None if a.pipeline is None else a.pipeline == "on", repetition_penalty=a.repetition_penalty,
        presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty, min_tokens=a.min_tokens,
    )
    try:
        result = generate(a.prompt, params, a.protocol, a.url, a.model, stream=not a.no_stream,
                          on_text=lambda t: print(t, end="", flush=True), timeout_s=a.timeout)
    except MinionsClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print()
    if a.timing:
        acc = f"{result.acceptance_rate:.2f}" if result.acceptance_rate is not None else "n/a"
        print(
            f"[{result.num_input_tokens} prompt tokens ({result.num_cached_tokens or 0} cached), "
            f"{result.num_output_tokens} tokens in {result.latency_s:.2f} s: "
            f"{result.tokens_per_s:.1f} tok/s, "
            f"TTFT {1000 * (result.ttft_s or 0):.0f} ms, acceptance {acc}, finish {result.finish_reason}, "
            f"draft lengths {result.draft_lengths}]",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
