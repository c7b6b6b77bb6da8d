"""The ``sparseclip-app`` program: its options (:func:`get_parser`), and :func:`main`, which
builds the page (:func:`~.ui.build_app`) and launches it."""
import argparse
import sys
from typing import Optional, Sequence

from detectron2.utils.logger import setup_logger

from ..cli.demo import DEFAULT_CONFIG
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
    parser.add_argument("--opts", default=[], nargs=argparse.REMAINDER, metavar="KEY VALUE",
                        help="config overrides, e.g. MODEL.DEVICE cpu MODEL.SPARSECLIP.CLIP.PRETRAINED none")
    return parser


def main(argv: Optional[Sequence[str]] = None, *, block: bool = True):
    """Parse ``argv``, build the page and launch it; returns the ``gr.Blocks`` (with
    ``block=False`` the server runs in a background thread: call ``.close()``)."""
    args = get_parser().parse_args(argv)
    setup_logger(name="sparseclip_d2")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    demo = build_app(args.config_file, args.opts, max_models=args.max_models, max_image_pixels=args.max_image_pixels)
    demo.queue(default_concurrency_limit=1)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=not block,
                show_error=False, footer_links=["api"], allowed_paths=[demo.engine.output_dir])
    return demo


def cli_main() -> None:
    """The ``sparseclip-app`` console entry point: a bad option or config gives one error line."""
    try:
        main()
    except (ValueError, OSError, ImportError) as e:
        sys.exit(f"sparseclip-app: error: {e}")
