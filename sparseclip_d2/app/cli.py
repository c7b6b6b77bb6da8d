"""The ``sparseclip-app`` program: its options (:func:`get_parser`), and :func:`main`, which
builds the page (:func:`~.ui.build_app`) and launches it."""
import argparse
import errno
import logging
import socket
from typing import Optional, Sequence

from detectron2.utils.logger import setup_logger

from ..cli.demo import DEFAULT_CONFIG
from ..common.errors import UserError, run_cli
from ..common.logs import console_level
from .ui import build_app

__all__ = ["get_parser", "main", "cli_main"]


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Interactive sparseclip_d2 app (Gradio): compare attention methods on a photo, click a patch "
                    "to see its attention row. Details: docs/app.md.")
    parser.add_argument("--config-file", default=DEFAULT_CONFIG, metavar="FILE",
                        help=f"launch config: a file or a packaged config name (default: {DEFAULT_CONFIG})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    parser.add_argument("--max-models", type=int, default=2, help="CLIP models kept in memory (default 2)")
    parser.add_argument("--max-image-pixels", type=int, default=40_000_000,
                        help="larger photos are refused (default 40000000)")
    parser.add_argument("--verbose", action="store_true", help="also log debug messages")
    parser.add_argument("--opts", default=[], nargs=argparse.REMAINDER, metavar="KEY VALUE",
                        help="config overrides, e.g. MODEL.DEVICE cpu MODEL.SPARSECLIP.CLIP.PRETRAINED none")
    return parser


def main(argv: Optional[Sequence[str]] = None, *, block: bool = True):
    """Parse ``argv``, build the page and launch it; returns the ``gr.Blocks`` (with
    ``block=False`` the server runs in a background thread: call ``.close()``)."""
    args = get_parser().parse_args(argv)
    setup_logger(name="sparseclip_d2")
    console_level(("sparseclip_d2",), logging.DEBUG if args.verbose else logging.INFO)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    check_port(args.host, args.port)  # before the model is built: a busy port is said at once
    demo = build_app(args.config_file, args.opts, max_models=args.max_models, max_image_pixels=args.max_image_pixels)
    demo.queue(default_concurrency_limit=1)
    try:
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=not block,
                    show_error=False, footer_links=["api"], allowed_paths=[demo.engine.output_dir])
    except OSError as e:  # Gradio's "Cannot find empty port" names its server_port, not our --port
        if "port" in str(e).lower():
            raise UserError(port_in_use(args.host, args.port)) from None
        raise
    return demo


def port_in_use(host: str, port: int) -> str:
    """The message of a busy ``--port``."""
    return (f"--port {port}: {host}:{port} is in use (another app, or another program); stop it or choose another "
            f"port, e.g. --port {port + 1 if port < 65535 else port - 1}")


def check_port(host: str, port: int) -> None:
    """Raise :class:`~sparseclip_d2.common.errors.UserError` when ``host:port`` cannot be bound
    because something listens there (Gradio would say so only after the model is built, and
    in terms of its own ``server_port``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: a TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(port_in_use(host, port)) from None
            if e.errno == errno.EADDRNOTAVAIL or isinstance(e, socket.gaierror):
                raise UserError(f"--host {host!r} is not an address of this machine ({e.strerror or e}); "
                                "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
            raise


def cli_main() -> None:
    """The ``sparseclip-app`` console entry point: a bad option or config, a busy port give one
    error line; Ctrl-C one line (``sparseclip_d2.common.errors.run_cli``)."""
    run_cli("sparseclip-app", main, interrupted="the app stopped; start it again with the same command (runs and "
                                                "downloads of this session are gone)")
