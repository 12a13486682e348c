"""How big a benchmark run is (--quick, --full, --tiny), its sections and its sides."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

SECTIONS = ("relay", "turn_cpu", "capacity", "reuse", "first_turn", "browser", "micro")
SIDES = ("direct", "chatsite", "chatsite_redis", "chatsite_x2", "naive", "litellm")
PEER_SIDE = "litellm"  # bench/peer.py: installed on first use, so only in --full or --peer
QUICK_SKIPS = ("micro", "first_turn")
DEMO_TTFB_MS = 100
DEMO_TPS = 50.0


@dataclass(frozen=True)
class Config:
    """How big each section runs; --quick, --full and --tiny pick one."""

    mode: str
    relay_ns: list[int]
    relay_tokens: int
    relay_rounds: int
    relay_min_turns: int
    idle_sockets: int
    rate_concurrency: list[int]
    rate_tokens: int  # 100 ms + (tokens - 1) / 50 tokens/s = the answer's latency
    rate_duration: float
    rate_warmup: float
    reuse_turns: int
    reuse_concurrency: int
    first_trials: int
    browser_tokens: list[int]
    browser_paced: list[tuple[int, float]]  # (tokens, tokens per second)
    # `/markdown N` answers at full speed with chatsite's page only (issue 15's target: 20,000),
    # beside the sizes above, which run every renderer for both answers
    browser_markdown: list[int] = field(default_factory=list)
    # CPU per turn (bench/turn_cpu.py): bursts of this many turns, one per user, all at once
    turn_cpu_turns: int = 200
    turn_cpu_tokens: int = 50
    turn_cpu_bursts: int = 3
    micro_args: dict[str, list[str]] = field(default_factory=dict)
    peer: bool = False  # measure the peer (LiteLLM proxy) beside chatsite

    @property
    def answer_seconds(self) -> float:
        return DEMO_TTFB_MS / 1000 + (self.relay_tokens - 1) / DEMO_TPS

    @property
    def rate_answer_seconds(self) -> float:
        return DEMO_TTFB_MS / 1000 + (self.rate_tokens - 1) / DEMO_TPS


QUICK = Config(
    mode="quick",
    relay_ns=[1, 20],
    relay_tokens=10,
    relay_rounds=1,
    relay_min_turns=3,
    idle_sockets=50,
    rate_concurrency=[10],
    rate_tokens=36,
    rate_duration=1.0,
    rate_warmup=0.3,
    reuse_turns=40,
    reuse_concurrency=5,
    first_trials=1,
    browser_tokens=[2000],
    browser_paced=[],
    browser_markdown=[20000],
    micro_args={"limiter": ["--calls", "200"], "tier": ["--rounds", "1"]},
)
FULL = Config(
    mode="full",
    relay_ns=[1, 50, 100, 200, 500],
    relay_tokens=100,
    relay_rounds=3,
    relay_min_turns=10,
    idle_sockets=1000,
    rate_concurrency=[100, 200, 400],
    rate_tokens=36,
    rate_duration=12.0,
    rate_warmup=3.0,
    reuse_turns=1000,
    reuse_concurrency=50,
    first_trials=6,
    browser_tokens=[2000, 20000],
    browser_paced=[(20000, 2000.0)],
    micro_args={"limiter": [], "tier": []},
    peer=True,
)


def tiny(config: Config) -> Config:
    """The smoke test's size: every step runs, nothing waits."""
    return replace(
        config,
        mode=config.mode + "-tiny",
        relay_ns=[1, 2],
        relay_tokens=5,
        relay_min_turns=1,
        idle_sockets=5,
        rate_concurrency=[2],
        rate_duration=0.5,
        rate_warmup=0.3,
        reuse_turns=4,
        reuse_concurrency=2,
        browser_tokens=[50],
        browser_paced=[],
        browser_markdown=[],
        turn_cpu_turns=3,
        turn_cpu_tokens=5,
        turn_cpu_bursts=1,
        micro_args={"limiter": ["--calls", "20"], "tier": ["--rounds", "1"]},
    )
