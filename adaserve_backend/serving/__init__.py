"""What every way of serving the engine shares: the thread that drives it, how a request's error is
named on each wire, incremental detokenization and response coalescing. The Triton models, the Ray
replicas and the OpenAI frontend sit above it."""
