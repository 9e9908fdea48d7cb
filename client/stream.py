"""Streaming gRPC client for the `ensemble` model: a CLI and an importable asyncio client.

    python -m client.stream "Write a haiku about GPUs" --slo-ms 50 --max-tokens 64

prints tokens as they arrive, then TTFT, mean TPOT and whether the SLO was met.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field

from adaserve_backend.slo import attains, tpot_seconds
from adaserve_backend.triton.grpc_client import EnsembleClient


@dataclass
class StreamResult:
    text: str = ""
    chunks: list[str] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)  # time.perf_counter() of each chunk
    start: float = 0.0
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    def tpot(self) -> float | None:
        """Mean time per output token after the first (server-counted tokens when reported)."""
        if not self.chunk_times:
            return None
        n = self.num_output_tokens if self.num_output_tokens is not None else len(self.chunks)
        return tpot_seconds(self.chunk_times[0], self.chunk_times[-1], n)


class AsyncStreamClient(EnsembleClient):
    """The ensemble client, plus a whole request timed chunk by chunk."""

    async def generate(self, prompt: str, max_tokens: int = 64, on_chunk=None, **kwargs) -> StreamResult:
        res = StreamResult(start=time.perf_counter())
        try:
            async for text, extra in self.stream(prompt, max_tokens, **kwargs):
                now = time.perf_counter()
                if text:
                    res.chunks.append(text)
                    res.chunk_times.append(now)
                    res.text += text
                    if on_chunk:
                        on_chunk(text)
                if "num_output_tokens" in extra:
                    res.num_output_tokens = int(extra["num_output_tokens"])
                if "finish_reason" in extra:
                    fr = extra["finish_reason"]
                    res.finish_reason = fr.decode() if isinstance(fr, bytes) else str(fr)
        except RuntimeError as e:
            res.error = str(e)
        return res


async def _main(args) -> int:
    client = AsyncStreamClient(args.url, args.model)
    try:
        res = await client.generate(
            args.prompt, args.max_tokens, on_chunk=lambda t: print(t, end="", flush=True), tpot_slo_ms=args.slo_ms,
            slo_class=args.slo_class, temperature=args.temperature, seed=args.seed, chat=args.chat,
        )
    finally:
        await client.close()
    print()
    if res.error:
        print(f"error: {res.error}", file=sys.stderr)
        return 1
    tpot = res.tpot()
    print(f"--- {res.num_output_tokens} tokens, finish reason {res.finish_reason}", file=sys.stderr)
    print(f"TTFT {res.ttft * 1e3:.1f} ms" + (f", mean TPOT {tpot * 1e3:.1f} ms" if tpot else ""), file=sys.stderr)
    if args.slo_ms is not None:
        print(f"SLO {args.slo_ms:.0f} ms/token: {'met' if attains(tpot, args.slo_ms) else 'MISSED'}", file=sys.stderr)
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--url", default="localhost:8001")
    ap.add_argument("--model", default="ensemble")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--slo-ms", type=float, help="TPOT SLO in ms per token")
    ap.add_argument("--slo-class", help="an SLO class from the server's config (coding, chat, summary)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    sys.exit(asyncio.run(_main(ap.parse_args())))


if __name__ == "__main__":
    main()
