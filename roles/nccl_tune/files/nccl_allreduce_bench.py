#!/usr/bin/env python3
"""All-reduce timings per candidate environment, one process per GPU; JSON on stdout.

Run with the box's own Python and torch (the vLLM virtualenv):

    nccl_allreduce_bench.py probe --backend nccl
    nccl_allreduce_bench.py measure --backend nccl --world-size 8 --sizes 14336,917504 \
        --candidates '[{"name": "defaults", "env": {}}, {"name": "ll", "env": {"NCCL_PROTO": "LL"}}]'

NCCL reads its variables once per process, so every candidate gets fresh worker processes, forked
from a parent that never touches CUDA, with the candidate's variables added to the inherited
environment. Each size is timed in rounds of back-to-back all-reduces after a barrier (on GPUs a
round is one CUDA graph replay, timed with CUDA events); the figure kept is the median over rounds
of (round time / all-reduces per round), as seen by rank 0.
Called by library/nccl_tune.py; the gloo backend runs the same code on CPU processes.
"""

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(backend):
    cuda = backend == "nccl"
    nccl = ".".join(str(part) for part in torch.cuda.nccl.version()) if cuda else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "device_count": torch.cuda.device_count() if cuda else 0,
    }


def element_type(backend):
    # vLLM's activations are bf16; gloo on CPU all-reduces float32 (same bytes, half the elements).
    return torch.bfloat16 if backend == "nccl" else torch.float32


def round_in_cuda_graph(tensor, per_round):
    """A round of all-reduces captured in a CUDA graph, as vLLM runs decode steps: what is timed is
    the GPUs' work, not Python's ~40 us launch cost per call that would otherwise hide small sizes."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_round):
            dist.all_reduce(tensor)
    return graph.replay


def time_sizes(backend, rank, sizes, warmup, rounds, per_round):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    dtype = element_type(backend)
    item = torch.tensor([], dtype=dtype).element_size()
    timings = []
    for size in sizes:
        tensor = torch.ones(max(1, size // item), dtype=dtype, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        per_op = []
        launch = round_in_cuda_graph(tensor, per_round) if backend == "nccl" else None
        for _ in range(rounds):
            dist.barrier()
            if launch:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                launch()
                end.record()
                end.synchronize()
                elapsed_s = start.elapsed_time(end) / 1e3
            else:
                began = time.perf_counter()
                for _ in range(per_round):
                    dist.all_reduce(tensor)
                elapsed_s = time.perf_counter() - began
            per_op.append(elapsed_s / per_round)
        timings.append({"bytes": tensor.numel() * item, "median_s": statistics.median(per_op)})
        del tensor
    return timings


def worker(rank, world_size, port, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        device_id = None
        if args.backend == "nccl":
            torch.cuda.set_device(rank)
            device_id = torch.device("cuda", rank)
        dist.init_process_group(args.backend, rank=rank, world_size=world_size, device_id=device_id)
        timings = time_sizes(args.backend, rank, args.sizes, args.warmup, args.rounds, args.per_round)
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            results.put({"timings": timings})
    except Exception as error:  # reported per candidate; the other candidates still run
        results.put({"error": f"rank {rank}: {type(error).__name__}: {error}"})
        traceback.print_exc(file=sys.stderr)


def run_candidate(candidate, args):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    inherited = dict(os.environ)
    os.environ.update({name: str(value) for name, value in candidate["env"].items()})
    try:
        port = free_port()
        workers = [
            context.Process(target=worker, args=(rank, args.world_size, port, args, results))
            for rank in range(args.world_size)
        ]
        for process in workers:
            process.start()
    finally:
        os.environ.clear()
        os.environ.update(inherited)
    deadline = time.monotonic() + args.candidate_timeout
    try:
        outcome = results.get(timeout=args.candidate_timeout)
    except Exception:
        outcome = {"error": f"timed out after {args.candidate_timeout:.0f} s"}
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in workers:
        if process.is_alive():
            process.kill()
            process.join()
    return {"name": candidate["name"], "env": candidate["env"], **outcome}


def measure(args):
    report = {"backend": args.backend, "world_size": args.world_size, "candidates": []}
    for candidate in args.candidates:
        began = time.monotonic()
        outcome = run_candidate(candidate, args)
        outcome["seconds"] = round(time.monotonic() - began, 2)
        print(f"candidate {candidate['name']}: {outcome.get('error', 'ok')}", file=sys.stderr, flush=True)
        report["candidates"].append(outcome)
    return report


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["probe", "measure"])
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--world-size", type=int, default=0, help="processes; default: every GPU")
    parser.add_argument("--sizes", type=lambda text: [int(size) for size in text.split(",")], default=[])
    parser.add_argument("--candidates", type=json.loads, default=[{"name": "defaults", "env": {}}])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--candidate-timeout", type=float, default=300.0)
    args = parser.parse_args()
    if args.action == "probe":
        print(json.dumps(probe(args.backend)))
        return
    if args.world_size < 1:
        args.world_size = torch.cuda.device_count() if args.backend == "nccl" else 2
    if args.world_size < 2:
        sys.exit("an all-reduce needs at least 2 processes")
    print(json.dumps(measure(args)))


if __name__ == "__main__":
    main()
