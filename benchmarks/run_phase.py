"""One benchmark phase in its own process: run the real flow, print measurements as JSON on the last line.

python -m benchmarks.run_phase DATASET OUTPUT --base-url URL --concurrency 100 [--judge openai]
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("output")
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--judge", default="openai")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--chunk-size", type=int, default=500)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--task-runner", default="threads", help="threads | processes | dask")
    parser.add_argument("--runner-workers", type=int, default=None, help="processes/dask: worker processes")
    parser.add_argument("--profile", default=None, help="write a pyinstrument profile here (.txt: text, else HTML)")
    args = parser.parse_args()

    from recall_tasks.config import RunParams
    from recall_tasks.pipeline.flow import recall_benchmark

    params = RunParams(
        dataset_uri=args.dataset, output_uri=args.output, judge=args.judge, base_url=args.base_url,
        max_concurrency=args.concurrency, chunk_size=args.chunk_size, max_workers=args.workers, baseline=None,
        task_runner=args.task_runner, workers=args.runner_workers,
    )  # fmt: skip
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler()
        profiler.start()
    trace = os.environ.get("RECALL_BENCH_RSS_TRACE")
    if trace:  # one line per second: elapsed seconds, RSS in MB (to see which phase of a run holds memory)
        import threading

        def sample() -> None:
            start = time.perf_counter()
            with open(trace, "w") as out:
                while True:
                    with open("/proc/self/status") as status:
                        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
                    out.write(f"{time.perf_counter() - start:.0f} {rss // 1024}\n")
                    out.flush()
                    time.sleep(1)

        threading.Thread(target=sample, daemon=True).start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = recall_benchmark(params)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if profiler is not None:
        profiler.stop()
        with open(args.profile, "w") as fh:  # .txt: the call tree as text; otherwise HTML
            if args.profile.endswith(".txt"):  # PROFILE_ALL=1: library frames too
                fh.write(profiler.output_text(show_all=bool(os.environ.get("PROFILE_ALL")), timeline=False))
            else:
                fh.write(profiler.output_html())
    # VmHWM, not getrusage's ru_maxrss: on Linux a child's ru_maxrss starts from its parent's peak (exec keeps
    # it), so a phase spawned by a benchmark holding 1M generated rows reported GBs it never used.
    with open("/proc/self/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    out = {
        "rows": summary["rows"], "scored": summary["scored"], "errors": summary["errors"],
        "cached": summary["cached"], "requests": summary["requests"], "prompt_tokens": summary["prompt_tokens"],
        "wall_s": wall, "cpu_s": cpu, "peak_rss_mb": rss_kb / 1024,
    }  # fmt: skip
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
