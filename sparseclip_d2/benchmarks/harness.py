"""The timing harness of the benchmark: each side (``project`` or ``upstream``) of a method runs in
a fresh worker process (:class:`Worker`, :func:`worker_main`), so that its peak RSS
(:func:`peak_rss_mib`) is its own; :func:`time_sides` starts the workers and times them
alternately, with the machine's load average (:func:`load_average`) over the timed runs.

Standard library only at import time: every worker imports it (:mod:`.worker`), the upstream
one possibly in another environment, and its peak RSS starts from a bare interpreter's.
"""
import contextlib
import json
import os
import subprocess
import sys
import time

#: the file a worker process runs (by path, in its side's interpreter)
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


def load_average() -> float:
    """The 1-minute load average (``/proc/loadavg``), or NaN where there is none."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: ``VmHWM`` of ``/proc/self/status``, the
    high-water mark of this process's own memory map (a fresh one at ``exec``, so a worker's
    figure holds its own side only; ``ru_maxrss`` on Linux can carry the pre-``exec`` peak of the
    process it was forked from). Where there is no ``/proc``: ``ru_maxrss`` (kB on Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_main(spec_json: str) -> None:
    """A worker (either side): build, say ``ready``, then one timed image per ``run`` line on stdin,
    and the FLOPs of one image per ``flops`` line (:func:`.flops.count_flops`, sent after the timed
    images so that the counter's own memory is in no peak RSS figure). Every ``run`` answer carries
    the process's peak RSS so far (``rss_mib``) and, on CUDA (``spec['device']``), the peak GPU memory
    allocated by torch (``gpu_mib``); one more image under module hooks per ``profile`` line
    (:func:`.stages.profile_modules`, after the timed images too); each timed image is bracketed by ``torch.cuda.synchronize``
    there, and with ``spec['dtype'] == 'fp16'`` every image (warm-up, timed, counted) runs under
    ``torch.autocast('cuda', float16)``."""
    import torch

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    if spec.get("mode") == "labels":  # the agreement driver's worker: one label map, written to a file
        from .agreement import side_labels

        side_labels(spec)
        return
    device = spec.get("device", "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"the {spec['side']} worker of {spec['method']}: --device cuda but torch.cuda.is_available() "
                         f"is False (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def gpu_mib():
        return torch.cuda.max_memory_allocated() / 2 ** 20 if device == "cuda" else None

    def precision():  # --dtype fp16 on CUDA: both sides' forward under the same autocast
        if device == "cuda" and spec.get("dtype") == "fp16":
            return torch.autocast("cuda", dtype=torch.float16)
        return contextlib.nullcontext()
    out = sys.stdout
    sys.stdout = sys.stderr  # the side's prints go to stderr; stdout carries the protocol
    if spec["side"] == "project":
        from .project import build_project as build
    else:
        from .upstream import build_upstream as build
    t0 = time.perf_counter()
    run = build(spec)
    with torch.no_grad(), precision():
        run()  # warm-up: text classifier, position-embedding resizes
    sync()
    out.write(json.dumps({"ready": time.perf_counter() - t0, "rss_mib": peak_rss_mib(), "gpu_mib": gpu_mib()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if line.strip() in ("flops", "profile"):  # after the timed images: one more image, not timed
            if line.strip() == "flops":
                from .flops import count_flops as measure
            else:
                from .stages import profile_modules as measure
            with precision():
                out.write(json.dumps(measure(run)) + "\n")
            out.flush()
            continue
        if line.strip() != "run":
            break
        with torch.no_grad(), precision():
            sync()
            t0 = time.perf_counter()
            run()
            sync()  # CUDA: the image's kernels finished, not only queued
            dt = time.perf_counter() - t0
        out.write(json.dumps({"s": dt, "rss_mib": peak_rss_mib(), "gpu_mib": gpu_mib()}) + "\n")
        out.flush()


class Worker:
    """The worker process of one side (``project`` or ``upstream``) of one method: a fresh
    interpreter, so that its peak RSS is that side's alone."""

    def __init__(self, python: str, spec: dict):
        self.proc = subprocess.Popen([python, WORKER_SCRIPT, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, OMP_NUM_THREADS=str(spec["threads"])))
        self.name = f"{spec['side']} {spec['method']}"
        ready = self._read()
        self.build_s, self.rss_ready_mib = ready["ready"], ready["rss_mib"]
        self.rss_mib = self.rss_ready_mib
        self.gpu_mib = ready.get("gpu_mib")  # CUDA: torch.cuda.max_memory_allocated, MiB

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise SystemExit(f"the {self.name} worker exited with status {code} (its error is above)")
        return json.loads(line)

    def run(self) -> float:
        answer = self._ask("run")
        self.rss_mib = answer["rss_mib"]
        self.gpu_mib = answer.get("gpu_mib")
        return answer["s"]

    def _ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def flops(self) -> dict:
        """The FLOPs of one more image (``{"gflops", "unsupported"}`` or ``{"error"}``), not timed;
        the peak RSS figure is not updated."""
        return self._ask("flops")

    def profile(self) -> dict:
        """Where the time of one more image goes, by module class (:func:`.stages.profile_modules`);
        not timed, the peak RSS figure not updated."""
        return self._ask("profile")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def time_sides(order, pythons: dict, reps: int, flops: bool = False, profile: bool = False):
    """Start a :class:`Worker` for each ``(side, spec)`` of ``order`` (in that order: the side whose
    build writes the other's input first; a ``None`` spec is skipped) with the interpreter
    ``pythons[side]``, then time ``reps`` images per side, alternately (project, upstream, then
    upstream, project, ...) so that a change of the machine's load hits both alike. Every worker
    is closed on the way out.

    Returns:
        ``(workers, times, loads)``: the workers by side (their peak RSS figures), the seconds of
        each side's images and the 1-minute load average before each timed image. With ``flops``,
        each worker's ``counted`` is its :meth:`Worker.flops` after the timed images (else None);
        with ``profile``, its ``profiled`` its :meth:`Worker.profile` after those (else None).
    """
    workers = {}
    try:
        for side, spec in order:
            if spec is not None:
                workers[side] = Worker(pythons[side], spec)
        times = {"project": [], "upstream": []}
        loads = []
        for rep in range(reps):
            for side in (("project", "upstream") if rep % 2 == 0 else ("upstream", "project")):
                if side in workers:
                    loads.append(load_average())
                    times[side].append(workers[side].run())
        for wk in workers.values():
            wk.counted = wk.flops() if flops else None
            wk.profiled = wk.profile() if profile else None
    finally:
        for wk in workers.values():
            wk.close()
    return workers, times, loads
