"""The app's Gradio page (:func:`build_app`): the input column, the output column and the
events that call an :class:`~.engine.AppEngine`. Gradio is imported when the page is built,
so the rest of the app (and ``--help``) works without it."""
import logging
import os
from typing import Dict, List, Optional, Sequence

from ..cli.demo import DEFAULT_CONFIG
from ..clip.spec import NORMALIZER_REGISTRY
from ..data import available_class_name_files
from ..utils.overlays import BANNER_COLOR, RANDOM_WEIGHTS_BANNER
from .engine import SAMPLE_PHOTOS, STATS_HEADERS, AppEngine, AppError, method_choices

__all__ = ["build_app", "spec_from_controls", "SOURCES"]

logger = logging.getLogger(__name__)

SOURCES = ("qk", "qq", "kk", "vv", "identity", "qq+kk", "qq+kk+vv")


def spec_from_controls(source: str, normalizer: str, alpha: float, layers: int) -> str:
    """The spec text of the page's controls, e.g. ``qq:entmax:1.2:layers=1``."""
    text = f"{source}:{normalizer}"
    if normalizer in ("entmax", "random_matched"):
        text += f":{float(alpha):g}"
    return text + f":layers={int(layers)}"


def _normalizer_names() -> List[str]:
    return [name for name, _ in NORMALIZER_REGISTRY]


def _message(e: BaseException) -> str:
    if isinstance(e, (AppError, ValueError, OSError, KeyError)):
        return f"**Error:** {e}"
    return f"**Error:** {type(e).__name__}: {e} (details in the server's log)"


def _import_gradio():
    try:
        import gradio as gr
    except ImportError as e:
        raise ImportError(f"the app needs Gradio ({e}): pip install 'sparseclip_d2[app]' "
                          "(or pip install -e '.[app]' in a checkout)") from None
    return gr


def build_app(config_file: str = DEFAULT_CONFIG, opts: Sequence[str] = (), *, device: Optional[str] = None,
              max_models: int = 2, max_image_pixels: int = 40_000_000, engine: Optional[AppEngine] = None):
    """The ``gr.Blocks`` page on an :class:`~.engine.AppEngine` (made from the arguments unless given).

    API endpoints (``gradio_client``): ``/run`` (upload file or None, sample name or None,
    classes text, class-set name or "", background or "", methods list, add-custom flag,
    custom spec) -> (status, photo, overlay picture, probability picture, method details
    (markdown), run id); ``/downloads``
    (run id) -> (status, files); ``/attention`` (run id, x, y in original photo pixels) ->
    (status, figure, stats table, rows ``.npz``). The engine is ``app.engine``.
    """
    gr = _import_gradio()
    engine = engine or AppEngine(config_file, opts, device=device, max_models=max_models,
                                 max_image_pixels=max_image_pixels)
    clip = engine.cfg.MODEL.SPARSECLIP.CLIP
    with gr.Blocks(title="sparseclip_d2") as demo:
        gr.Markdown(f"## sparseclip_d2: training-free open-vocabulary segmentation with sparse attention\n"
                    f"Launch config `{os.path.basename(engine.config_file)}`, CLIP `{clip.NAME}` "
                    f"(`{clip.PRETRAINED}`), device `{engine.cfg.MODEL.DEVICE}`. Spec methods wrap this model; "
                    "`config:` methods build their own (with the launch overrides).")
        with gr.Row():
            with gr.Column(scale=1):
                ins = _input_column(gr)
            with gr.Column(scale=2):
                outs = _output_column(gr)
        _wire_spec(gr, ins)
        _wire_run(gr, engine, ins, outs)
        _wire_downloads(engine, outs)
        _wire_attention(gr, engine, outs)
    demo.engine = engine
    return demo


def _input_column(gr) -> Dict:
    """The photo, vocabulary, methods and custom-spec controls and the Run button, by name."""
    c = {}
    c["upload"] = gr.File(label="photo (upload)", file_types=["image"], type="filepath", elem_id="upload")
    c["sample"] = gr.Dropdown(choices=[("(none)", "")] + [(v, k) for k, v in SAMPLE_PHOTOS.items()],
                              value="voc", allow_custom_value=True,
                              label="or a sample photo (used when nothing is uploaded)",
                              elem_id="sample")
    c["classes"] = gr.Textbox(label="classes (commas between classes, semicolons between synonyms)",
                              value="person, chair, dining table; table, bottle, wall", elem_id="classes")
    c["class_set"] = gr.Dropdown(choices=[""] + available_class_name_files(), value="", allow_custom_value=True,
                                 label="or a dataset's class set (wins when set)",
                                 elem_id="class_set")
    c["background"] = gr.Textbox(label="background class (optional, with typed classes)", value="",
                                 elem_id="background")
    c["methods"] = gr.Dropdown(choices=method_choices(), value=["cfg", "clip"], multiselect=True,
                               allow_custom_value=True, elem_id="methods",
                               label="methods (or type a spec such as kk:entmax:1.5 and press Enter)")
    with gr.Accordion("custom spec (source / normaliser / alpha / layers)", open=False):
        with gr.Row():
            c["source"] = gr.Dropdown(choices=list(SOURCES), value="qq", label="source", allow_custom_value=True)
            c["normalizer"] = gr.Dropdown(choices=_normalizer_names(), value="entmax", label="normaliser")
        with gr.Row():
            c["alpha"] = gr.Slider(1.0, 2.0, value=1.2, step=0.05, label="alpha (entmax)")
            c["layers"] = gr.Number(value=1, precision=0, minimum=1, label="layers")
        c["custom"] = gr.Textbox(value=spec_from_controls("qq", "entmax", 1.2, 1), label="spec (editable)",
                                 elem_id="custom_spec")
        c["use_custom"] = gr.Checkbox(value=False, label="add this spec to the methods", elem_id="use_custom")
    c["run_button"] = gr.Button("Run", variant="primary", elem_id="run")
    return c


def _output_column(gr) -> Dict:
    """The status, photo, overlays, details, attention, probability and download panels, by name."""
    c = {}
    c["status"] = gr.Markdown("Choose a photo, type classes, pick methods and press **Run**.", elem_id="status")
    c["photo"] = gr.Image(label="photo: click a patch to see its attention", type="filepath",
                          interactive=False, elem_id="photo")
    gr.Markdown("**Overlays**, one per method (two a row), one legend under them (the corner button enlarges them)")
    c["overlays"] = gr.Image(label="overlays (one per method, side by side)", type="filepath", show_label=False,
                             interactive=False, buttons=["fullscreen", "download"], elem_id="overlays")
    # The page is the photo, the overlays and the attention; the rest folds away (issue 43).
    with gr.Accordion("method details and mean probabilities", open=False, elem_id="details_section"):
        c["details"] = gr.Markdown("", elem_id="details")
    with gr.Accordion("attention of a clicked patch", open=True, elem_id="attention_section"):
        with gr.Row():
            c["qx"] = gr.Number(label="x (photo pixels)", value=None, elem_id="qx")
            c["qy"] = gr.Number(label="y (photo pixels)", value=None, elem_id="qy")
            c["att_button"] = gr.Button("Show attention", elem_id="show_attention")
        c["att_status"] = gr.Markdown("", elem_id="att_status")
        c["att_image"] = gr.Image(label="attention row of the selected patch (one colour scale)",
                                  type="filepath", interactive=False, show_label=False, elem_id="attention")
        c["att_table"] = gr.Dataframe(headers=STATS_HEADERS, label="statistics of the row (means over heads)",
                                      interactive=False, elem_id="att_table")
        c["att_file"] = gr.File(label="attention rows (.npz: row_K (heads, tokens) per method K, token_K, "
                                      "window_K)", elem_id="att_file")
    with gr.Accordion("class probability maps (0 to 1, the top classes; one panel per method)", open=False,
                      elem_id="probs_section"):
        c["probs"] = gr.Image(label="class probability maps (0 to 1, top classes; one panel per method)",
                              type="filepath", show_label=False, interactive=False,
                              buttons=["fullscreen", "download"], elem_id="probs")
    with gr.Accordion("downloads: label PNG, probabilities .npy per method", open=False, elem_id="downloads_section"):
        with gr.Row():
            c["dl_button"] = gr.Button("Prepare downloads", elem_id="prepare_downloads", scale=0)
            c["dl_status"] = gr.Markdown("", elem_id="dl_status")
        c["files"] = gr.File(label="downloads: label PNG, probabilities .npy (+ .json) per method",
                             file_count="multiple", elem_id="files")
    c["run_id"] = gr.Textbox(visible=False, elem_id="run_id")
    return c


def _wire_spec(gr, ins: Dict) -> None:
    """The custom spec box follows the source / normaliser / alpha / layers controls."""
    controls = [ins["source"], ins["normalizer"], ins["alpha"], ins["layers"]]

    def update_spec(src, norm, a, n):
        try:
            return spec_from_controls(src, norm, a, int(n or 1))
        except (TypeError, ValueError):
            return gr.update()

    for control in controls:
        control.change(update_spec, controls, ins["custom"], api_visibility="private")


def _run_status(name: str, image, out: Dict) -> str:
    """The status line of a finished run: the random-weights banner, the photo, the classes
    and each method's Predictor seconds."""
    seconds = ", ".join(f"{m} {s:.2f} s" for m, s in out["seconds"].items())
    head = (f"<span style='color:{BANNER_COLOR};font-weight:bold'>{RANDOM_WEIGHTS_BANNER}</span> "
            f"(PRETRAINED none: random CLIP weights; the maps show a random model)\n\n"
            if out["random_weights"] else "")
    return (f"{head}**{name}** ({image.shape[1]}x{image.shape[0]}), {len(out['result'].names)} classes; "
            f"Predictor: {seconds}. Click the photo to see a patch's attention.")


def _wire_run(gr, engine: AppEngine, ins: Dict, outs: Dict) -> None:
    """Run (the ``/run`` endpoint); a new run clears the old run's downloads."""
    def do_run(upload_path, sample_name, text, set_name, bg, chosen, add_custom, custom_text,
               progress=gr.Progress()):
        try:
            image, name = engine.load_photo(upload_path, sample_name)
            vocab, bgr = engine.vocabulary(text, set_name, bg)
            chosen = list(chosen or [])
            if add_custom:
                chosen.append(str(custom_text or "").strip() or "<empty custom spec>")
            out = engine.run(image, vocab, bgr, chosen, progress=progress)
        except Exception as e:  # never a traceback in the page; the server keeps serving
            if not isinstance(e, (AppError, ValueError, OSError)):
                logger.exception("run failed")
            return _message(e), None, None, None, "", ""
        return (_run_status(name, image, out), out["display_file"], out["overlays"], out["probabilities"],
                out["details"], out["run_id"])

    inputs = [ins[k] for k in ("upload", "sample", "classes", "class_set", "background", "methods", "use_custom",
                               "custom")]
    outputs = [outs[k] for k in ("status", "photo", "overlays", "probs", "details", "run_id")]
    ins["run_button"].click(do_run, inputs, outputs, api_name="run").then(  # the old run's downloads go
        lambda: (None, ""), None, [outs["files"], outs["dl_status"]], api_visibility="private")


def _wire_downloads(engine: AppEngine, outs: Dict) -> None:
    """Prepare downloads (the ``/downloads`` endpoint)."""
    def do_downloads(rid):
        try:
            paths = engine.downloads(rid)
        except Exception as e:
            if not isinstance(e, (AppError, ValueError, OSError)):
                logger.exception("downloads failed")
            return _message(e), None
        return f"{len(paths)} files: label PNG, probabilities .npy and .json of each method", paths

    outs["dl_button"].click(do_downloads, [outs["run_id"]], [outs["dl_status"], outs["files"]], api_name="downloads")


def _wire_attention(gr, engine: AppEngine, outs: Dict) -> None:
    """Show attention (the ``/attention`` endpoint), and a click on the photo: its pixel in x
    and y, then the attention."""
    def do_attention(rid, x, y):
        try:
            out = engine.attention(rid, x, y)
        except Exception as e:
            if not isinstance(e, (AppError, ValueError, OSError)):
                logger.exception("attention failed")
            return _message(e), None, None, None
        return f"patch at x={float(x):g}, y={float(y):g}", out["figure"], out["table"], out["npz"]

    def on_click(rid, evt: gr.SelectData):
        try:
            run = engine.get_run(rid)
        except AppError:
            return gr.update(), gr.update()
        s = run.display_scale
        xd, yd = evt.index[0], evt.index[1]
        W, H = run.image.shape[1], run.image.shape[0]
        return (min(int((xd + 0.5) / s), W - 1), min(int((yd + 0.5) / s), H - 1))

    att_inputs = [outs["run_id"], outs["qx"], outs["qy"]]
    att_outputs = [outs[k] for k in ("att_status", "att_image", "att_table", "att_file")]
    outs["att_button"].click(do_attention, att_inputs, att_outputs, api_name="attention")
    outs["photo"].select(on_click, [outs["run_id"]], [outs["qx"], outs["qy"]], api_visibility="private").then(
        do_attention, att_inputs, att_outputs, api_visibility="private")
