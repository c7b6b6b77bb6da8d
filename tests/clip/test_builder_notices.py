"""build_clip's log output: one random-weights warning of its own (open_clip's root notice
dropped without configuring the root logger), and an immediate, clear error when an
open_clip tag's weights are neither cached nor reachable (instead of a minute of retries)."""
import os
import socket
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _python(src, env=None):
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([sys.executable, "-c", src], cwd=ROOT, env=dict(clean, **(env or {})),
                          capture_output=True, text=True, timeout=600)


def test_random_build_warns_once_and_leaves_the_root_logger_alone():
    res = _python(
        "import logging, torch\n"
        "from sparseclip_d2.clip.builder import build_clip\n"
        "torch.manual_seed(0)\n"
        "build_clip('sparseclip-tiny-vit', 'none')\n"
        "build_clip('ViT-S-32', 'none')\n"  # an open_clip config: open_clip's own notice path
        "print('root handlers', len(logging.getLogger().handlers))\n"
        "logging.getLogger('some.library').warning('after the build')\n")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("RANDOM WEIGHTS") == 2  # once per build, ours
    assert "No pretrained weights loaded" not in res.stderr
    assert "root handlers 0" in res.stdout
    # with no basicConfig side effect the library's warning is printed once, bare
    assert "after the build" in res.stderr and "WARNING:some.library" not in res.stderr


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_weights_fail_at_once_naming_model_tag_and_host(tmp_path):
    port = _closed_port()
    res = _python(
        "from sparseclip_d2.clip.builder import build_clip\n"
        "build_clip('ViT-B-16-quickgelu', 'openai')\n",
        env={"HF_ENDPOINT": f"https://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path / "hf"),
             "HF_HOME": str(tmp_path / "hfhome")})
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: could not obtain the weights of CLIP 'ViT-B-16-quickgelu' "
                           "pretrained='openai'"), last
    assert "not in the local download cache" in last and f"127.0.0.1" in last
    assert "MODEL.SPARSECLIP.CLIP.PRETRAINED" in last
    assert "Retrying" not in res.stderr and "During handling" not in res.stderr


def test_cached_weights_are_found_without_the_network(tmp_path):
    from sparseclip_d2.clip.builder import _weights_source
    import open_clip

    tag_cfg = open_clip.get_pretrained_cfg("ViT-B-16-quickgelu", "openai")
    model_id, filename = os.path.split(tag_cfg["hf_hub"])
    # huggingface_hub's cache layout: models--org--name/{refs/main, snapshots/<commit>/<file>}
    repo = tmp_path / ("models--" + model_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    host, port, cached = _weights_source(tag_cfg, str(tmp_path))
    assert host and port == 443 and cached == []
    (snap / "open_clip_model.safetensors").write_bytes(b"x")
    host, port, cached = _weights_source(tag_cfg, str(tmp_path))
    assert cached == [str(snap / "open_clip_model.safetensors")]

    url_cfg = {"url": "https://example.org/clip/ViT-B-16.pt"}
    assert _weights_source(url_cfg, str(tmp_path)) == ("example.org", 443, [])
    (tmp_path / "ViT-B-16.pt").write_bytes(b"x")
    assert _weights_source(url_cfg, str(tmp_path)) == ("example.org", 443, [str(tmp_path / "ViT-B-16.pt")])
