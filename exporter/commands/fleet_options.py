"""Options shared by `simulate` and `emulate`: the replicas' parameters, server and workload."""

from __future__ import annotations

import argparse

from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.simulator import Router
from model.simulation.workloads import LengthDist, LengthKind

# Paper Table I, Llama-3.1-8B on H100 (ms).
DEFAULT_PARAMS = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)


def add_fleet_options(p: argparse.ArgumentParser) -> None:
    """Add the options for the replicas' parameters, server, workload and routing."""
    p.add_argument("--alpha-ms", type=float, default=DEFAULT_PARAMS.alpha_ms)
    p.add_argument("--beta-ms", type=float, default=DEFAULT_PARAMS.beta_ms)
    p.add_argument("--gamma-ms", type=float, default=DEFAULT_PARAMS.gamma_ms)
    p.add_argument("--max-batch-size", type=int, default=256, help="vLLM max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-queue-size", type=int, help="reject arrivals beyond this queue")
    p.add_argument("--input-tokens", type=float, default=1024.0, help="mean prompt length")
    p.add_argument("--output-tokens", type=float, default=512.0, help="mean output length")
    p.add_argument("--lengths", choices=[k.value for k in LengthKind if k != LengthKind.EMPIRICAL],
                   default=LengthKind.UNIFORM.value, help="length law (uniform: [x/2, 3x/2])")
    p.add_argument("--length-cv", type=float, default=0.5, help="CV of the lognormal law")
    p.add_argument("--interarrival-cv", type=float, default=1.0, help="0 constant, 1 Poisson")
    p.add_argument("--paper-profile", type=float, metavar="BASE_RPS",
                   help="the paper's 44-minute ramp (Table IV) from this baseline instead")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", choices=[r.value for r in Router], default=Router.LEAST_LOADED.value)
    p.add_argument("--kv-capacity-tokens", type=int, help="KV cache per replica, tokens")
    p.add_argument("--seed", type=int, default=0)


def parse_fleet_options(
    args: argparse.Namespace,
) -> tuple[ServiceParams, ServerConfig, LengthDist, LengthDist]:
    """The parameters, server and input and output length laws the fleet options give."""
    params = ServiceParams(args.alpha_ms, args.beta_ms, args.gamma_ms)
    server = ServerConfig(args.max_batch_size, args.max_num_batched_tokens, args.max_queue_size)
    kind = LengthKind(args.lengths)
    return (
        params,
        server,
        LengthDist(kind, args.input_tokens, cv=args.length_cv),
        LengthDist(kind, args.output_tokens, cv=args.length_cv),
    )
