#!/usr/bin/env python
"""Seconds per request of the app (``sparseclip_d2/app.py``) next to the Predictor calls it wraps.

Starts the app in-process on a free local port, sends ``--repeats`` identical ``/run``
requests through ``gradio_client`` (the sample VOC photo, the classes below, the chosen
methods; the client fetches every file the request returns, as a caller does), and times, on
the same photo and vocabulary, the plain ``Predictor`` calls the request makes (one per
method, ``attention=True``). Each repeat sends the request twice: with gradio_client's
defaults, and with ``ssl_verify=False``. The URL is plain http, so nothing is verified either
way, but the default client loads the CA bundle into a new SSL context for every file it
fetches (``httpx.stream`` per file; encode/httpx#2298), which costs about 0.1 to 0.2 s a file
on the loaded development machine. Requests and calls alternate, so a change of the
machine's load hits all columns alike. The first request and call of each (model build, text embeddings) are
warm-ups and are not counted. Prints the medians, the overhead (goal: <= 10 %), the median of
the per-pair ratios, the overhead inside each request (from the Predictor seconds in its
status line), the seconds of the on-demand ``/downloads`` request (label PNGs and
probabilities; not part of ``/run``), and the load average.

  python tools/benchmark_app.py --methods cfg clip sclip --repeats 7 \\
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

    from sparseclip_d2.app import main as app_main, sample_photo
    from sparseclip_d2.data.image_io import parse_vocabulary

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app_main(["--config-file", args.config_file, "--port", str(port), "--opts", *args.opts], block=False)
    try:
        clients = {"default": Client(f"http://127.0.0.1:{port}/", verbose=False),
                   "ssl_verify=False": Client(f"http://127.0.0.1:{port}/", verbose=False, ssl_verify=False)}
        client = clients["default"]
        request = (None, args.sample, args.classes, "", "", list(args.methods), False, "")
        engine = demo.engine
        image = sample_photo(args.sample)
        vocab = parse_vocabulary(args.classes)
        load_start = _load()
        app_times, pred_times, inside, dl_times = [], [], [], []
        fast_times, fast_inside = [], []

        def request_once(c):
            t0 = time.perf_counter()
            out = c.predict(*request, api_name="/run")
            dt = time.perf_counter() - t0
            if out[0].startswith("**Error:**"):
                raise SystemExit(out[0])
            # The status line gives the seconds of the Predictor calls inside this request.
            inner = sum(float(v) for v in re.findall(r" ([0-9.]+) s[,.]", out[0].split("Predictor:")[1]))
            return out, dt, inner

        for i in range(args.repeats + 1):
            out, dt, inner = request_once(client)
            predictors = [engine.predictor(m) for m in args.methods]  # the app's own, already built
            t1 = time.perf_counter()
            for p in predictors:
                p(image, vocab, attention=True)
            dp = time.perf_counter() - t1
            t2 = time.perf_counter()
            status, _ = client.predict(out[-1], api_name="/downloads")
            dd = time.perf_counter() - t2
            if status.startswith("**Error:**"):
                raise SystemExit(status)
            _, df, inner_f = request_once(clients["ssl_verify=False"])
            if i:
                app_times.append(dt)
                pred_times.append(dp)
                inside.append(inner)
                dl_times.append(dd)
                fast_times.append(df)
                fast_inside.append(inner_f)
            print(f"{'warm-up' if not i else f'repeat {i}'}: app request {dt:.3f} s (ssl_verify=False: {df:.3f} s), "
                  f"Predictor calls {dp:.3f} s ({100 * (dt - dp) / dp:+.1f} %, {100 * (df - dp) / dp:+.1f} %), "
                  f"{_load()}", flush=True)
        clip = engine.cfg.MODEL.SPARSECLIP.CLIP
        b = statistics.median(pred_times)
        print(f"model {clip.NAME} ({clip.PRETRAINED}), device {engine.cfg.MODEL.DEVICE}, photo {args.sample} "
              f"{image.shape[1]}x{image.shape[0]}, short side {engine.cfg.INPUT.MIN_SIZE_TEST}, {len(vocab)} classes, "
              f"methods {' '.join(args.methods)}, torch threads {__import__('torch').get_num_threads()}, "
              f"{args.repeats} repeats")
        print(f"at the start: {load_start}; at the end: {_load()}")
        print(f"Predictor calls the request wraps: median {b:.3f} s  (runs: {_runs(pred_times)})")
        for name, times, inner in (("default", app_times, inside), ("ssl_verify=False", fast_times, fast_inside)):
            a = statistics.median(times)
            print(f"app request (gradio_client /run, client {name}): median {a:.3f} s  (runs: {_runs(times)})")
            print(f"  app overhead: {a - b:+.3f} s = {100 * (a - b) / b:+.1f} % (goal <= 10 %)")
            ratios = [100 * (t - p) / p for t, p in zip(times, pred_times)]
            print(f"  per request and the calls next to it: median {statistics.median(ratios):+.1f} % "
                  f"(pairs: {', '.join(f'{r:+.1f}' for r in ratios)})")
            c = statistics.median([t - n for t, n in zip(times, inner)])
            print(f"  within each request (request - its own Predictor calls, from the status line): median "
                  f"{c:+.3f} s = {100 * c / statistics.median(inner):+.1f} % of them")
        print(f"downloads on demand (gradio_client /downloads, after each run): median "
              f"{statistics.median(dl_times):.3f} s  (runs: {_runs(dl_times)})")
    finally:
        demo.close()
        demo.engine.close()


if __name__ == "__main__":
    main()
