#!/usr/bin/env python
"""Seconds per request of the app (``sparseclip_d2/app/``) next to the Predictor calls it wraps.

Starts the app in-process on a free local port, sends ``--repeats`` identical ``/run``
requests through ``gradio_client`` (the sample VOC photo, the classes below, the chosen
methods; the client fetches every file the request returns, as a caller does: three a
request), and times, on the same photo and vocabulary, the plain ``Predictor`` calls the
request makes (one per method, ``attention=True``). Each repeat sends the request twice: with
gradio_client's defaults, and with ``ssl_verify=False``. The URL is plain http, so nothing is
verified either way, but the default client loads the CA bundle into a new SSL context for
every file it fetches and for its queue calls (``httpx.stream`` / ``httpx.post`` per call;
encode/httpx#2298), which costs up to 0.2 s a file on a loaded machine.

Interleaved, so that machine load hits every column alike: each repeat runs one default
request, the Predictor calls, and one ``ssl_verify=False`` request, in the order default,
calls, fast on odd repeats and fast, calls, default on even ones (a drift of the load
during a repeat then favours neither client). The first repeat (model build, text
embeddings) is a warm-up and is not counted. Each repeat's line carries the 1-minute load
average. Prints the medians, the overhead (goal: <= 10 %), the median of the per-repeat
ratios (each request against the calls of its own repeat), the overhead inside each request
(the request's time minus its own Predictor seconds, from its status line: immune to load
changes between request and calls), the CPU seconds of this process (server and client
threads) per request and per calls (robust to load, blind to waiting), the seconds of the
on-demand ``/downloads`` request
(label PNGs and probabilities; not part of ``/run``), and the load averages.

  OMP_NUM_THREADS=1 python tools/benchmark_app.py --methods cfg clip sclip --repeats 7 \\
      --opts MODEL.SPARSECLIP.CLIP.PRETRAINED none MODEL.DEVICE cpu MODEL.SPARSECLIP.TEXT.CACHE_DIR off
"""
import argparse
import os
import re
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package


def _load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg()) + " (1, 5, 15 min)"


def _runs(values) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--config-file", default="demo")
    parser.add_argument("--methods", nargs="+", default=["cfg", "clip", "sclip"])
    parser.add_argument("--classes", default="person, chair, dining table; table, bottle, wall, floor, window")
    parser.add_argument("--sample", default="voc", help="sample photo (voc, arc2017)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")

    from gradio_client import Client

    from sparseclip_d2.app import main as app_main
    from sparseclip_d2.app.engine import sample_photo
    from sparseclip_d2.data.image_io import parse_vocabulary

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app_main(["--config-file", args.config_file, "--port", str(port), "--opts", *args.opts], block=False)
    try:
        clients = {"default": Client(f"http://127.0.0.1:{port}/", verbose=False),
                   "ssl_verify=False": Client(f"http://127.0.0.1:{port}/", verbose=False, ssl_verify=False)}
        request = (None, args.sample, args.classes, "", "", list(args.methods), False, "")
        engine = demo.engine
        image = sample_photo(args.sample)
        vocab = parse_vocabulary(args.classes)
        load_start = _load()
        names = ("default", "ssl_verify=False")
        times = {n: [] for n in names}
        inside = {n: [] for n in names}
        cpu = {n: [] for n in names + ("calls",)}
        pred_times, dl_times, loads = [], [], []

        def request_once(name):
            c0, t0 = time.process_time(), time.perf_counter()
            out = clients[name].predict(*request, api_name="/run")
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if out[0].startswith("**Error:**"):
                raise SystemExit(out[0])
            # The status line gives the seconds of the Predictor calls inside this request.
            inner = sum(float(v) for v in re.findall(r" ([0-9.]+) s[,.]", out[0].split("Predictor:")[1]))
            return out, dt, inner, dc

        def calls():
            predictors = [engine.predictor(m) for m in args.methods]  # the app's own, already built
            c0, t0 = time.process_time(), time.perf_counter()
            for p in predictors:
                p(image, vocab, attention=True)
            return time.perf_counter() - t0, time.process_time() - c0

        for i in range(args.repeats + 1):
            order = ("default", "calls", "ssl_verify=False") if i % 2 == 0 else ("ssl_verify=False", "calls", "default")
            got = {}
            for step in order:
                got[step] = calls() if step == "calls" else request_once(step)
            run_id = got["default"][0][-1]
            t0 = time.perf_counter()
            status, _ = clients["default"].predict(run_id, api_name="/downloads")
            dd = time.perf_counter() - t0
            if status.startswith("**Error:**"):
                raise SystemExit(status)
            load = os.getloadavg()[0]
            dp, cp = got["calls"]
            if i:
                pred_times.append(dp)
                dl_times.append(dd)
                loads.append(load)
                cpu["calls"].append(cp)
                for n in names:
                    times[n].append(got[n][1])
                    inside[n].append(got[n][2])
                    cpu[n].append(got[n][3])
            da, df = got["default"][1], got["ssl_verify=False"][1]
            print(f"{'warm-up' if not i else f'repeat {i}'} (load {load:.2f}; order {', '.join(order)}): "
                  f"app request {da:.3f} s, ssl_verify=False {df:.3f} s; Predictor calls {dp:.3f} s "
                  f"({100 * (da - dp) / dp:+.1f} %, {100 * (df - dp) / dp:+.1f} %); inside the requests "
                  f"{got['default'][2]:.3f}, {got['ssl_verify=False'][2]:.3f} s; CPU seconds {got['default'][3]:.3f}, "
                  f"{got['ssl_verify=False'][3]:.3f}, calls {cp:.3f}", flush=True)
        clip = engine.cfg.MODEL.SPARSECLIP.CLIP
        b = statistics.median(pred_times)
        print(f"model {clip.NAME} ({clip.PRETRAINED}), device {engine.cfg.MODEL.DEVICE}, photo {args.sample} "
              f"{image.shape[1]}x{image.shape[0]}, short side {engine.cfg.INPUT.MIN_SIZE_TEST}, {len(vocab)} classes, "
              f"methods {' '.join(args.methods)}, torch threads {__import__('torch').get_num_threads()}, "
              f"{args.repeats} repeats")
        print(f"at the start: {load_start}; at the end: {_load()}; 1-min load after each repeat: median "
              f"{statistics.median(loads):.2f} (min {min(loads):.2f}, max {max(loads):.2f})")
        print(f"Predictor calls the request wraps: median {b:.3f} s  (runs: {_runs(pred_times)})")
        for name in names:
            a = statistics.median(times[name])
            print(f"app request (gradio_client /run, client {name}): median {a:.3f} s  (runs: {_runs(times[name])})")
            print(f"  app overhead: {a - b:+.3f} s = {100 * (a - b) / b:+.1f} % (goal <= 10 %)")
            ratios = [100 * (t - p) / p for t, p in zip(times[name], pred_times)]
            print(f"  per repeat, the request against the calls of its repeat: median {statistics.median(ratios):+.1f} % "
                  f"(repeats: {', '.join(f'{r:+.1f}' for r in ratios)})")
            c = statistics.median([t - n for t, n in zip(times[name], inside[name])])
            print(f"  within each request (request - its own Predictor calls, from the status line): median "
                  f"{c:+.3f} s = {100 * c / statistics.median(inside[name]):+.1f} % of them")
        c = statistics.median(cpu["calls"])
        print(f"CPU seconds of this process (server and client threads; load-independent, but blind to waiting): "
              f"Predictor calls median {c:.3f} s (runs: {_runs(cpu['calls'])})")
        for name in names:
            a = statistics.median(cpu[name])
            print(f"  request, client {name}: median {a:.3f} s = {100 * (a - c) / c:+.1f} %  (runs: {_runs(cpu[name])})")
        print(f"downloads on demand (gradio_client /downloads, after each repeat): median "
              f"{statistics.median(dl_times):.3f} s  (runs: {_runs(dl_times)})")
    finally:
        demo.close()
        demo.engine.close()


if __name__ == "__main__":
    main()
