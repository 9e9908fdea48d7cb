"""What the soak (benchmarks/soak.py) observes: one record per request as its client saw it, and one
sample of the server's memory and KV gauges at a time. Times are seconds since the load started."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# How a client behaves (benchmarks/soak_plan.py draws one per request)
COMPLETE = "complete"  # reads the stream to its end
CANCEL = "cancel"  # closes the connection after a number of streamed events, as a client that lost interest
DISCONNECT = "disconnect"  # drops its socket (RST, no clean close) after a number of events
HOSTILE = "hostile"  # a malformed or invalid request that must get a 4xx
KINDS = (COMPLETE, CANCEL, DISCONNECT, HOSTILE)

# How a request ended, as its client saw it
DONE = "done"  # the stream ended with its final event (or a whole non-streamed answer came)
LEFT = "left"  # the client closed or dropped the stream as planned
REFUSED = "refused"  # 429 / 503 before any output: admission said no, which is not a failure
ANSWERED = "answered"  # a hostile request got an HTTP status (judged by its code)
FAILED = "failed"  # an HTTP error other than a refusal, or an error event in the stream
STALLED = "stalled"  # no byte for the hang timeout: a hang
UNTERMINATED = "unterminated"  # the connection ended without the final event: no final response, a hang
HANG_OUTCOMES = (STALLED, UNTERMINATED)


@dataclass
class SoakRecord:
    request_id: str
    kind: str
    category: str  # an SLO class, or the hostile case's name
    arrival_s: float  # when it was due (open loop: the client sends at its arrival time)
    first_token_s: float | None = None
    end_s: float | None = None
    events: int = 0  # streamed events that carried text
    output_tokens: int | None = None  # the usage block's completion tokens, where the stream reached it
    status: int | None = None  # HTTP status, None if none came
    explained: bool = False  # an error answer in OpenAI's shape (JSON with error.message)
    outcome: str | None = None
    detail: str = ""  # an error message or a hostile case's answer, shortened

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def hung(self) -> bool:
        return self.outcome in HANG_OUTCOMES

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ServerSample:
    """The served stack at one time: resident memory of tritonserver with its Python backend stubs (the
    sum, and each process's: where a growth is), of the OpenAI frontend (MiB), and Triton's gauges
    (None where the metrics port did not answer)."""

    t_s: float
    triton_rss_mib: float
    processes_mib: dict[str, float]
    frontend_rss_mib: float
    kv_blocks_used: float | None
    running: float | None
    waiting: float | None
    # Cumulative counters soak_speed differences between samples (its SERIES, machine_cpu, and
    # tritonserver's CPU seconds); empty where none could be read
    counters: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
